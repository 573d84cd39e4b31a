"""Reading the registry as git holds it: what a commit contains, and what differs from HEAD.

The engine serves what the registry's history holds, never the working tree: a hand edit that was
not committed (a manifest changed together with its source's hash, say) is not served. Reads go
through `git show REV:PATH`, so no GitPython object (and no git process) outlives a call.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kernelloop.common.errors import RegistryError


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    except FileNotFoundError:
        raise RegistryError("the kernel registry needs the `git` program on PATH") from None
    except subprocess.TimeoutExpired:
        raise RegistryError(f"git {args[0]} in {repo} did not answer within 60 s") from None


def resolve(repo: Path, revision: str) -> str:
    """The full commit sha that `revision` names in the registry; RegistryError when none."""
    out = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if out.returncode != 0:
        raise RegistryError(f"{revision!r} is not a commit of the registry at {repo}")
    return out.stdout.decode().strip()


def read_at(repo: Path, revision: str, rel: str) -> str | None:
    """The text of `rel` in commit `revision`; None when that commit has no such file."""
    out = _git(repo, "show", f"{revision}:{rel}")
    if out.returncode != 0:
        return None
    try:
        return out.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RegistryError(f"{rel} at {revision[:10]} in {repo} is not UTF-8 ({exc})") from None


def changed_paths(repo: Path) -> list[str]:
    """Tracked files whose working copy (or index) differs from HEAD: hand edits nobody committed."""
    out = _git(repo, "status", "--porcelain", "--untracked-files=no")
    if out.returncode != 0:
        raise RegistryError(f"git status failed in {repo}: {out.stderr.decode(errors='replace').strip()}")
    return sorted(line[3:] for line in out.stdout.decode(errors="replace").splitlines() if line.strip())
