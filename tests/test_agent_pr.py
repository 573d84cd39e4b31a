"""`agent pr` against a local bare remote and a fake GitHub API (no network)."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kernelloop.agent import cli
from kernelloop.agent import pr as pr_logic
from kernelloop.agent.commands import pr as pr_cmd
from kernelloop.history import History
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import Provenance

SOURCE = "import torch\n\n\ndef forward(x):\n    return x * {k}  # variant {k}\n"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


class Setup:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bare = tmp / "remote.git"
        self.clone = tmp / "clone"
        self.registry = Registry(tmp / "registry")
        self.history_path = tmp / "history.db"
        git(tmp, "init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        git(tmp, "clone", "--quiet", str(self.bare), str(self.clone))
        git(self.clone, "checkout", "--quiet", "-b", "main")
        git(self.clone, "config", "user.name", "Team")
        git(self.clone, "config", "user.email", "team@example.com")
        (self.clone / "README.md").write_text("team repo\n")
        git(self.clone, "add", "README.md")
        git(self.clone, "commit", "--quiet", "-m", "initial")
        git(self.clone, "push", "--quiet", "origin", "main")

    def add(self, op: str, k: int, speedup: float):
        source = SOURCE.format(k=k)
        verdict = {"op": op, "device": "cpu-interpreter", "correct": True, "accepted": True, "speedup": speedup,
                   "speedup_interval": [speedup - 0.1, speedup + 0.1], "baseline": "torch",
                   "timing": {"shape": {"n": 64}, "dtype": "float32", "baseline_s": 2e-5 * k, "candidate_s": 1e-5,
                              "roofline_fraction": 0.42}}
        with History(self.history_path) as hist:
            cid, _ = hist.record_attempt(op, source, "search", verdict)
        return self.registry.add(op, source, device="cpu-interpreter", dtype="float32", bucket="*", speedup=speedup,
                                 speedup_ci=(speedup - 0.1, speedup + 0.1), provenance=Provenance("search", history_id=cid)).entry

    def argv(self, *extra: str) -> list[str]:
        return ["pr", "--repo", str(self.clone), "--remote", "origin", "--base", "main",
                "--registry", str(self.registry.path), "--history", str(self.history_path), *extra]

    def remote_branches(self) -> list[str]:
        out = git(self.bare, "for-each-ref", "--format=%(refname:short)", "refs/heads")
        return sorted(out.split())

    def tree_file(self, branch: str, path: str) -> bytes:
        return subprocess.run(["git", "show", f"{branch}:{path}"], cwd=self.bare, check=True,
                              capture_output=True).stdout


@pytest.fixture
def setup(tmp_path, monkeypatch):
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GITHUB_TOKEN", "KERNELLOOP_GITHUB_API", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    if pr_cmd not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", cli.COMMANDS + (pr_cmd,))
    return Setup(tmp_path)


def agent(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


class FakeGitHub:
    """A stdlib HTTP server answering POST /repos/<slug>/pulls with a canned status and JSON."""

    def __init__(self, status: int = 201, answer: dict | None = None):
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.requests.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                data = json.dumps(fake.answer).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.status, self.answer = status, answer or {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def github():
    servers: list[FakeGitHub] = []

    def start(status: int = 201, answer: dict | None = None) -> FakeGitHub:
        servers.append(FakeGitHub(status, answer))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def test_pr_pushes_export_branch_and_proposes_each_entry_once(setup, capsys):
    e1 = setup.add("rmsnorm", 1, 1.5)
    e2 = setup.add("silu_mul", 2, 2.25)

    code, out, err = agent(setup.argv(), capsys)
    assert code == 0, err
    branches = [b for b in setup.remote_branches() if b != "main"]
    assert len(branches) == 1 and branches[0].startswith("kernelloop/") and branches[0].endswith(e1.id)
    branch = branches[0]
    assert f"branch: {branch} pushed to origin" in out

    # The export is byte-identical to the registry's files, and nothing else changed.
    for rel in ("manifest.json", e1.source_path, e2.source_path):
        assert setup.tree_file(branch, f"kernelloop/registry/{rel}") == (setup.registry.path / rel).read_bytes()
    changed = git(setup.bare, "diff", "--name-only", "main", branch).split()
    assert sorted(changed) == sorted(f"kernelloop/registry/{r}" for r in ("manifest.json", e1.source_path, e2.source_path))
    log = git(setup.bare, "log", "-1", "--format=%an <%ae>%n%s", branch).splitlines()
    assert log == ["kernelloop <kernelloop@localhost>", "kernelloop: 2 kernels for rmsnorm, silu_mul"]

    # The user's checkout is untouched: still on main, clean; the PR branch tracks the remote.
    assert git(setup.clone, "branch", "--show-current").strip() == "main"
    assert git(setup.clone, "status", "--porcelain") == ""
    assert git(setup.clone, "rev-parse", "--abbrev-ref", f"{branch}@{{upstream}}").strip() == f"origin/{branch}"

    # The body: both entries with speedups, timings, provenance and how to roll back.
    for e in (e1, e2):
        assert e.id in out
        assert f"agent registry rollback {e.id}" in out
    assert "1.500x [1.400, 1.600]" in out and "2.250x [2.150, 2.350]" in out
    assert "20.0 µs" in out and "40.0 µs" in out and "10.0 µs" in out and "42.0%" in out
    assert "### How to roll back" in out and "git revert" in out

    with History(setup.history_path) as hist:
        events = [e for e in hist.registry_events() if e["kind"] == "pr"]
    assert sorted(e["entry_id"] for e in events) == sorted([e1.id, e2.id])
    sha = git(setup.bare, "rev-parse", branch).strip()
    assert all(e["commit_sha"] == sha and e["detail"]["branch"] == branch for e in events)

    # Nothing new: no branch.
    code, out, err = agent(setup.argv(), capsys)
    assert (code, out.strip(), err) == (0, "nothing to propose: every registry entry has been proposed", "")
    assert len(setup.remote_branches()) == 2

    # A third entry: a new branch with all three kernels, only the new one listed.
    e3 = setup.add("rope", 3, 1.75)
    code, out, err = agent(setup.argv(), capsys)
    assert code == 0, err
    (branch3,) = [b for b in setup.remote_branches() if b not in ("main", branch)]
    assert branch3.endswith(e3.id)
    for rel in ("manifest.json", e1.source_path, e2.source_path, e3.source_path):
        assert setup.tree_file(branch3, f"kernelloop/registry/{rel}") == (setup.registry.path / rel).read_bytes()
    assert e3.id in out and f"agent registry rollback {e3.id}" in out and "1.750x" in out
    assert e1.id not in out and e2.id not in out
    assert "3 entries in all; 2 of them were proposed before" in out
    assert git(setup.clone, "branch", "--show-current").strip() == "main"


def test_pr_refuses_uncommitted_changes(setup, capsys):
    setup.add("rmsnorm", 1, 1.5)
    (setup.clone / "README.md").write_text("edited, not committed\n")
    code, out, err = agent(setup.argv(), capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "uncommitted changes" in err
    assert setup.remote_branches() == ["main"]
    assert (setup.clone / "README.md").read_text() == "edited, not committed\n"
    assert git(setup.clone, "branch", "--list", "kernelloop/*") == ""


def test_pr_dry_run_touches_nothing(setup, capsys):
    e1 = setup.add("rmsnorm", 1, 1.5)
    code, out, err = agent(setup.argv("--dry-run"), capsys)
    assert code == 0, err
    assert "dry run" in out and f"-{e1.id}" in out and f"agent registry rollback {e1.id}" in out
    assert setup.remote_branches() == ["main"]
    assert git(setup.clone, "branch", "--list", "kernelloop/*") == ""
    with History(setup.history_path) as hist:
        assert not [e for e in hist.registry_events() if e["kind"] == "pr"]


def test_pr_opens_pull_request_through_the_api(setup, github, capsys, monkeypatch):
    e1 = setup.add("rmsnorm", 1, 1.5)
    fake = github(201, {"html_url": "https://github.example/team/repo/pull/7", "number": 7})
    monkeypatch.setenv("GITHUB_TOKEN", "t0ken")
    monkeypatch.setenv("KERNELLOOP_GITHUB_API", fake.url)
    code, out, err = agent(setup.argv("--github-repo", "team/repo"), capsys)
    assert code == 0, err
    assert "pull request: https://github.example/team/repo/pull/7" in out
    (req,) = fake.requests
    assert req["path"] == "/repos/team/repo/pulls"
    assert req["headers"]["Authorization"] == "Bearer t0ken"
    assert req["headers"]["Accept"] == "application/vnd.github+json"
    (branch,) = [b for b in setup.remote_branches() if b != "main"]
    assert req["json"]["head"] == branch and req["json"]["base"] == "main"
    assert req["json"]["title"] == "kernelloop: 1 kernel for rmsnorm"
    assert e1.id in req["json"]["body"] and f"agent registry rollback {e1.id}" in req["json"]["body"]
    with History(setup.history_path) as hist:
        (event,) = [e for e in hist.registry_events() if e["kind"] == "pr"]
    assert event["detail"]["url"] == "https://github.example/team/repo/pull/7" and event["ok"] is True


def test_pr_api_error_is_one_line_and_keeps_the_branch(setup, github, capsys):
    setup.add("rmsnorm", 1, 1.5)
    fake = github(422, {"message": "Validation Failed", "errors": [{"message": "A pull request already exists"}]})
    code, out, err = agent(setup.argv("--token", "t0ken", "--github-repo", "team/repo", "--github-api", fake.url), capsys)
    assert code == 2
    assert err.count("\n") == 1 and "422" in err and "Validation Failed" in err
    (branch,) = [b for b in setup.remote_branches() if b != "main"]
    assert branch in err
    assert len(fake.requests) == 1
    assert git(setup.clone, "branch", "--show-current").strip() == "main"


def test_pr_json_and_command_registers_on_its_own_parser(setup, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    pr_cmd.register(parser.add_subparsers(dest="command"))
    e1 = setup.add("rmsnorm", 1, 1.5)
    args = parser.parse_args(setup.argv("--json", "--dry-run"))
    assert args.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["id"] for p in data["proposed"]] == [e1.id]
    assert data["dry_run"] is True and data["pushed"] is False and data["branch"].endswith(e1.id)
    assert data["proposed"][0]["timing"]["candidate_s"] == 1e-5
    assert data["github"].startswith("no GitHub token")


@pytest.mark.parametrize("url,slug", [
    ("https://github.com/team/repo.git", "team/repo"),
    ("https://github.com/team/repo", "team/repo"),
    ("git@github.com:team/my.repo.git", "team/my.repo"),
    ("ssh://git@github.com/team/repo.git", "team/repo"),
    ("https://gitlab.com/team/repo.git", None),
    ("/srv/git/repo.git", None),
])
def test_github_slug(url, slug):
    assert pr_logic.github_slug(url) == slug
