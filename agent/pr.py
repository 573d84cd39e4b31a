"""Proposing registry kernels to a team repository: an export, a branch, a commit, a push, a PR.

The registry's current manifest and the sources of its entries are copied byte for byte under
`kernelloop/registry/` of a git working tree, on a new branch made in a temporary `git worktree`
(the user's checkout never moves, so nothing of theirs can be committed or lost), committed as
`kernelloop <kernelloop@localhost>` and pushed with its upstream set. Entries count as proposed once
History holds a registry event of kind "pr" for their id; those events are recorded after the push.
When a GitHub token and repository are known, the pull request is opened through the REST API.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import git

from kernelloop.agent.pr_body import EXPORT_DIR, branch_name, render_body, title_for
from kernelloop.agent.pr_github import DEFAULT_GITHUB_API, PrError, check_slug, github_slug, one_line, open_pull_request
from kernelloop.common.errors import RegistryError
from kernelloop.history import History, default_history_path
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import Entry
from kernelloop.kernels.registry.manifest import MANIFEST_NAME
from kernelloop.kernels.registry.revision import read_at
from kernelloop.kernels.registry.store import ACTOR

NOTHING_NEW = "nothing to propose: every registry entry has been proposed"


# -- what to propose ---------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The registry as read once: the manifest's bytes, its entries, and every entry's source bytes."""

    path: Path
    manifest: bytes
    entries: list[Entry]
    sources: dict[str, bytes]  # entry.source_path -> bytes
    commit: str | None  # the registry repository's HEAD, when it is one


def read_registry(reg: Registry) -> Snapshot:
    """The registry's HEAD commit read once: the manifest and the sources it names, each checked
    against its sha256 (hand edits nobody committed are not proposed, as they are not served)."""
    commit = reg.head()
    if commit is None:
        reg.entries()  # a path that is not a registry raises its one line here
        return Snapshot(reg.path, b"", [], {}, None)
    entries = reg.entries(commit)
    sources = {e.source_path: reg.checked_source(e, commit).encode("utf-8") for e in entries}
    manifest = (read_at(reg.path, commit, MANIFEST_NAME) or "").encode("utf-8")
    return Snapshot(reg.path, manifest, entries, sources, commit)


def proposed_ids(hist: History | None) -> set[str]:
    if hist is None:
        return set()
    return {e["entry_id"] for e in hist.registry_events(limit=-1) if e["kind"] == "pr" and e["entry_id"]}


def latest_timing(hist: History | None, entry: Entry) -> dict[str, Any] | None:
    """The timing of the latest verdict on the entry's history candidate, when there is one."""
    cid = entry.provenance.history_id
    if hist is None or cid is None:
        return None
    try:
        cand = hist.candidate(int(cid))
    except (TypeError, ValueError):
        return None
    if not cand or not cand.get("verdicts"):
        return None
    timing = cand["verdicts"][-1].get("timing")
    return dict(timing) if isinstance(timing, dict) and timing else None


# -- git ---------------------------------------------------------------------------------------


def _git_error(exc: git.GitCommandError) -> PrError:
    stderr = str(exc.stderr or "").strip()
    stderr = re.sub(r"^stderr:\s*'?|'$", "", stderr)
    verb = exc.command[1] if isinstance(exc.command, (list, tuple)) and len(exc.command) > 1 else "git"
    return PrError(one_line(f"git {verb} failed: {stderr or exc}"))


@dataclass
class Target:
    """The team repository: a clean working tree with a remote and a base branch."""

    repo: git.Repo
    remote: str
    base: str
    fetch: bool = field(default=False)  # the remote has `base`: fetch it and branch from it

    @property
    def root(self) -> Path:
        return Path(self.repo.working_tree_dir or ".")


def open_target(path: str | os.PathLike[str], remote: str, base: str | None, *, for_real: bool = True) -> Target:
    """The repository at (or above) `path`. `for_real=False` (a dry run) neither asks the remote
    nor refuses a dirty tree."""
    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise PrError(f"{path} is not a git working tree (pass --repo)") from None
    if repo.bare:
        raise PrError(f"{repo.git_dir} is a bare repository; --repo needs a working tree")
    if for_real and repo.is_dirty(index=True, working_tree=True, untracked_files=True):
        raise PrError(f"{repo.working_tree_dir} has uncommitted changes; commit or stash them first (nothing was proposed)")
    if remote not in [r.name for r in repo.remotes]:
        raise PrError(f"{repo.working_tree_dir} has no remote {remote!r} (pass --remote)")
    if base is None:
        if repo.head.is_detached:
            raise PrError(f"{repo.working_tree_dir} is on a detached HEAD; pass --base BRANCH")
        base = repo.active_branch.name
    target = Target(repo, remote, base)
    if for_real:
        try:
            target.fetch = bool(repo.git.ls_remote("--heads", remote, f"refs/heads/{base}").strip())
        except git.GitCommandError as exc:
            raise _git_error(exc) from None
    if for_real and not target.fetch and f"refs/heads/{base}" not in {h.path for h in repo.heads}:
        raise PrError(f"base branch {base!r} is neither on {remote!r} nor local in {repo.working_tree_dir}")
    return target


def _write_export(root: Path, snapshot: Snapshot) -> None:
    out = root / EXPORT_DIR
    for rel, data in [(MANIFEST_NAME, snapshot.manifest), *snapshot.sources.items()]:
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def commit_and_push(target: Target, snapshot: Snapshot, branch: str, message: str) -> str:
    """Branch from the base in a temporary worktree, write the export, commit, push with upstream.
    Returns the commit sha. On any failure before the push succeeds the local branch is deleted."""
    repo, remote, base = target.repo, target.remote, target.base
    tmp = Path(tempfile.mkdtemp(prefix="kernelloop-pr-"))
    worktree = tmp / "tree"
    created = pushed = False
    try:
        if target.fetch:
            repo.git.fetch("--quiet", remote, f"+refs/heads/{base}:refs/remotes/{remote}/{base}")
            start = f"refs/remotes/{remote}/{base}"
        else:
            start = f"refs/heads/{base}"
        repo.git.worktree("add", "--quiet", "--no-track", "-b", branch, str(worktree), start)
        created = True
        wt = git.Repo(worktree)
        try:
            _write_export(worktree, snapshot)
            wt.git.add("--", EXPORT_DIR)
            if not wt.git.diff("--cached", "--name-only").strip():
                raise PrError(f"{base} already holds this export under {EXPORT_DIR}/; nothing to commit")
            env = {"GIT_AUTHOR_NAME": ACTOR.name, "GIT_AUTHOR_EMAIL": ACTOR.email,  # the registry's identity
                   "GIT_COMMITTER_NAME": ACTOR.name, "GIT_COMMITTER_EMAIL": ACTOR.email}
            with wt.git.custom_environment(**env):
                wt.git.commit("--quiet", "-m", message)
            sha = wt.head.commit.hexsha
        finally:
            wt.close()
        repo.git.push("--quiet", "--set-upstream", remote, f"refs/heads/{branch}:refs/heads/{branch}")
        pushed = True
        return sha
    except git.GitCommandError as exc:
        raise _git_error(exc) from None
    finally:
        if created:
            try:
                repo.git.worktree("remove", "--force", str(worktree))
            except git.GitCommandError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            repo.git.worktree("prune")
            if created and not pushed:
                repo.git.branch("-D", branch)
        except git.GitCommandError:
            pass


# -- the whole proposal ------------------------------------------------------------------------


@dataclass
class Options:
    repo: str = "."
    remote: str = "origin"
    base: str | None = None
    registry: str | None = None
    history: str | None = None
    dry_run: bool = False
    token: str | None = None
    github_repo: str | None = None
    github_api: str | None = None


@dataclass
class Result:
    new: list[Entry]
    branch: str | None = None
    base: str | None = None
    remote: str | None = None
    title: str | None = None
    body: str | None = None
    commit: str | None = None
    pushed: bool = False
    dry_run: bool = False
    url: str | None = None
    github: str | None = None  # why no pull request was opened through the API, when none was
    timings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "proposed": [{**e.to_dict(), "timing": self.timings.get(e.id)} for e in self.new],
            "branch": self.branch, "base": self.base, "remote": self.remote, "title": self.title,
            "body": self.body, "commit": self.commit, "pushed": self.pushed, "dry_run": self.dry_run,
            "url": self.url, "github": self.github,
            **({} if self.new else {"message": NOTHING_NEW}),
        }


def _open_history(path: str | None, *, create: bool) -> History | None:
    p = default_history_path() if path is None else Path(path).expanduser()
    if not create and not p.exists():
        return None
    return History(p)


def propose(opts: Options, now: datetime | None = None) -> Result:
    """Export, branch, commit, push and (when configured) open the PR for entries not yet proposed.

    Raises PrError/RegistryError/HistoryError (KernelloopError) with one line. When the pull request
    cannot be opened after a successful push, the "pr" events are recorded and PrError names the branch."""
    reg = Registry(opts.registry)
    if opts.registry is not None and not reg.path.exists():
        raise RegistryError(f"no registry at {reg.path}")
    snapshot = read_registry(reg)
    token = opts.token or os.environ.get("GITHUB_TOKEN") or None
    api = opts.github_api or os.environ.get("KERNELLOOP_GITHUB_API") or DEFAULT_GITHUB_API
    slug = check_slug(opts.github_repo) if opts.github_repo else None

    hist = _open_history(opts.history, create=not opts.dry_run)
    try:
        return _propose(opts, snapshot, hist, token, api, slug, now)
    finally:
        if hist is not None:
            hist.close()


def _propose(opts: Options, snapshot: Snapshot, hist: History | None, token: str | None, api: str,
             slug: str | None, now: datetime | None) -> Result:
    done = proposed_ids(hist)
    new = [e for e in snapshot.entries if e.id not in done]
    if not new:
        return Result(new=[], dry_run=opts.dry_run)
    target = open_target(opts.repo, opts.remote, opts.base, for_real=not opts.dry_run)
    try:
        timings = {e.id: latest_timing(hist, e) for e in new}
        result = Result(new=new, branch=branch_name(new, now), base=target.base, remote=target.remote,
                        title=title_for(new), body=render_body(new, snapshot, timings),
                        dry_run=opts.dry_run, timings=timings)
        if slug is None:
            slug = github_slug(target.repo.remote(target.remote).url)
        if not token or not slug:
            missing = [what for what, ok in (("no GitHub token (GITHUB_TOKEN or --token)", token),
                                             ("no GitHub repository (--github-repo or a github.com remote)", slug))
                       if not ok]
            result.github = " and ".join(missing)
        if opts.dry_run:
            return result
        message = f"{result.title}\n\nEntries: {', '.join(e.id for e in new)}\n"
        result.commit = commit_and_push(target, snapshot, result.branch, message)
        result.pushed = True
        error: PrError | None = None
        if result.github is None:
            try:
                result.url = open_pull_request(api, slug, token, title=result.title, head=result.branch,
                                               base=target.base, body=result.body)
            except PrError as exc:
                error = exc
        for e in new:
            detail = {"branch": result.branch, "url": result.url, "remote": target.remote, "base": target.base}
            if error is not None:
                detail["error"] = str(error)
            hist.record_registry_event("pr", e.op, entry_id=e.id, commit_sha=result.commit, device=e.device,
                                       dtype=e.dtype, bucket=e.bucket, speedup=e.speedup, ok=error is None,
                                       detail=detail)
        if error is not None:
            raise PrError(f"{error}; branch {result.branch} is pushed to {target.remote}: "
                          "open the pull request from it by hand")
        return result
    finally:
        target.repo.close()
