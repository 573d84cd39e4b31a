"""Adversarial suite: every exploit in tests/sandbox_candidates/ must be caught, every control accepted.

Each candidate file says what the sandbox must answer, on a line like

    # expect: static=<code> runtime=<code>      (codes may list alternatives: a|b)
    # expect: control                           (must be judged correct)

`static=` is the verdict's failure with the static pre-check on; `runtime=` the failure with it
switched off, which proves the runtime guards hold by themselves. `# op: <name>` picks the op
(default rmsnorm); `# timing: on` judges the file with A/B timing (the clock-patching exploits).

All candidates of one (op, timing, static) group are judged in one `judge_files` batch (one
pre-warmed fork server), once per module; each file is then its own test id. Afterwards the machine
must be as it was: no canary files, HOME unchanged, the project tree's `git status` unchanged and no
`sleep 600` left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
CANARY_FALLBACK = Path("/tmp/kernelloop-canary")
CANARY_NAMES = ("kernelloop-canary-escape-write.txt", "kernelloop-canary-swallowed.txt")
TIMEOUT_S = 20.0
MEMORY_MB = 3072
SEED = 1234

_EXPECT = re.compile(r"^# expect:\s*(.+?)\s*$", re.M)
_OP = re.compile(r"^# op:\s*(\w+)\s*$", re.M)
_TIMING = re.compile(r"^# timing:\s*on\s*$", re.M)


def _parse(path: Path) -> dict:
    text = path.read_text()
    m = _EXPECT.search(text)
    if not m:
        raise ValueError(f"{path.name}: no `# expect:` line")
    spec = m.group(1)
    entry = {"path": path, "name": path.stem, "op": (_OP.search(text) or [None, "rmsnorm"])[1],
             "timing": bool(_TIMING.search(text)), "control": spec == "control"}
    if not entry["control"]:
        parts = dict(p.split("=", 1) for p in spec.split())
        if set(parts) != {"static", "runtime"}:
            raise ValueError(f"{path.name}: malformed expectation {spec!r}")
        entry["static"] = tuple(parts["static"].split("|"))
        entry["runtime"] = tuple(parts["runtime"].split("|"))
    return entry


CASES = [_parse(p) for p in sorted(CANDIDATES.glob("*.py"))]
CASE_BY_NAME = {c["name"]: c for c in CASES}
NAMES = [c["name"] for c in CASES]


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _sleep_600_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"sleep 600" in cmdline.replace(b"\0", b" "):
            pids.add(int(proc.name))
    return pids


def _canary_paths(canary_dir: Path) -> list[Path]:
    return [d / n for d in (canary_dir, CANARY_FALLBACK, Path("/tmp")) for n in CANARY_NAMES]


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A private HOME and canary directory for the module, and the machine's state before judging."""
    home = tmp_path_factory.mktemp("home")
    (home / ".keep").write_text("unchanged\n")
    canary_dir = tmp_path_factory.mktemp("canary")
    cache = tmp_path_factory.mktemp("kernelloop-cache")  # the harness's own caches (bandwidth), not HOME
    for stale in _canary_paths(canary_dir):  # our own markers from an earlier, failed run
        if stale.exists():
            stale.unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("KERNELLOOP_TEST_CANARY_DIR", str(canary_dir))
        mp.setenv("KERNELLOOP_CACHE", str(cache))
        before = {"git": _git_status(), "home": _listing(home), "sleep": _sleep_600_pids(),
                  "fallback_dir": CANARY_FALLBACK.exists()}
        state = {"home": home, "canary_dir": canary_dir, "before": before, "tmp": tmp_path_factory}
        yield state
    # Leave nothing running that a candidate started, whatever the assertions said.
    for pid in _sleep_600_pids() - before["sleep"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def judged(machine):
    """{(name, "static" | "runtime"): Verdict}: every group judged in one batch per static mode."""
    from sandbox import CheckOptions, judge_files

    registry = machine["tmp"].mktemp("registry")
    groups: dict[tuple[str, bool], list[dict]] = {}
    for case in CASES:
        groups.setdefault((case["op"], case["timing"]), []).append(case)
    results = {}
    for (op, timing), cases in sorted(groups.items()):
        for mode, static in (("static", True), ("runtime", False)):
            opts = CheckOptions(device="cpu", registry=registry, timing=timing, static_check=static,
                                timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, seed=SEED)
            verdicts = judge_files(op, [c["path"] for c in cases], opts)
            assert len(verdicts) == len(cases)
            for case, verdict in zip(cases, verdicts):
                results[(case["name"], mode)] = verdict
    return results


def _describe(v) -> str:
    d = v.to_json()
    keep = ("file", "correct", "accepted", "failure", "stage", "reason", "speedup", "log_tail")
    return json.dumps({k: d.get(k) for k in keep}, default=str)[:2000]


def _check(case: dict, v, mode: str) -> None:
    if case["control"]:
        assert v.correct is True, f"control judged incorrect ({mode}): {_describe(v)}"
        assert v.failure in (None, "not-faster"), f"control failed ({mode}): {_describe(v)}"
        return
    expected = case[mode]
    assert v.failure in expected, f"{mode}: expected failure in {expected}, got {_describe(v)}"
    assert v.accepted is False, f"{mode}: exploit accepted: {_describe(v)}"
    if v.failure != "not-faster":
        assert v.correct is False, f"{mode}: exploit judged correct: {_describe(v)}"
    json.dumps(v.to_json(), default=str)  # the verdict stays JSON-ready


def test_expectations_are_well_formed():
    from sandbox.verdict import FAILURES

    assert len(CASES) >= 27
    assert sum(c["control"] for c in CASES) >= 4
    for case in CASES:
        for mode in ("static", "runtime"):
            for code in case.get(mode, ()):
                assert code in FAILURES, f"{case['name']}: unknown failure code {code!r}"


@pytest.mark.parametrize("name", NAMES)
def test_static_on(judged, name):
    _check(CASE_BY_NAME[name], judged[(name, "static")], "static")


@pytest.mark.parametrize("name", NAMES)
def test_static_off_runtime_guards_hold(judged, name):
    _check(CASE_BY_NAME[name], judged[(name, "runtime")], "runtime")


def test_machine_unchanged(judged, machine):
    """After every exploit ran (twice): no canary, HOME as it was, the tree as it was, no orphan."""
    before = machine["before"]
    leaked = [str(p) for p in _canary_paths(machine["canary_dir"]) if p.exists()]
    assert not leaked, f"a candidate wrote outside its scratch directory: {leaked}"
    if not before["fallback_dir"]:
        assert not CANARY_FALLBACK.exists(), f"a candidate created {CANARY_FALLBACK}"
    assert _listing(machine["home"]) == before["home"], "HOME changed"
    assert _git_status() == before["git"], "the project tree changed"
    orphans = _sleep_600_pids() - before["sleep"]
    assert not orphans, f"`sleep 600` left running: pids {sorted(orphans)}"


def test_cli_check_forged_verdict_is_not_believed(tmp_path):
    """The forger prints an accepted verdict line; the CLI's own last line must say otherwise."""
    forge = CANDIDATES / "forge_verdict.py"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check", "rmsnorm", str(forge), "--json", "--no-timing", "--no-history",
         "--registry", str(tmp_path / "registry")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    verdict = json.loads(last)
    if isinstance(verdict, list):  # one verdict per file
        assert len(verdict) == 1, last
        verdict = verdict[0]
    assert verdict["correct"] is False and verdict["accepted"] is False, last
