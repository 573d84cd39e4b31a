"""The kernel registry: a git repository holding `manifest.json` and content-addressed sources.

Every change is one commit; a rollback is a new commit that undoes an earlier one (history is
never rewritten). Writers hold an exclusive file lock, so a daemon and a CLI can't interleave.
Readers see a commit (HEAD unless a revision is named), never the working tree: an uncommitted
hand edit is not served, and writers refuse to commit on top of one.
"""

from __future__ import annotations

import fcntl
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import git

from kernelloop.common.errors import RegistryError
from kernelloop.common.paths import data_path
from kernelloop.kernels.device import Fingerprint
from kernelloop.kernels.registry.entry import Entry, Provenance, select_entry, sha256_text, utc_now
from kernelloop.kernels.registry.loader import load_forward
from kernelloop.kernels.registry.manifest import MANIFEST_NAME, atomic_write, parse_manifest, render_manifest
from kernelloop.kernels.registry.revision import changed_paths, read_at, resolve

log = logging.getLogger(__name__)

ACTOR = git.Actor("kernelloop", "kernelloop@localhost")


def default_registry_path() -> Path:
    """$KERNELLOOP_REGISTRY, else $XDG_DATA_HOME/kernelloop/registry (~/.local/share/...)."""
    return data_path("KERNELLOOP_REGISTRY", "registry")


@dataclass(frozen=True)
class Commit:
    sha: str
    message: str
    date: str


@dataclass(frozen=True)
class Added:
    """What `Registry.add` did: the entry, and the commit that added it (the gate alternates `commit^`
    and `commit`)."""

    entry: Entry
    commit: str


class Registry:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else default_registry_path()

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    def exists(self) -> bool:
        return self.manifest_path.exists()

    # -- reading ---------------------------------------------------------------------------

    def entries(self, revision: str | None = None) -> list[Entry]:
        """All entries at `revision` (default HEAD); an absent registry has none. A corrupt one raises
        RegistryError."""
        if not self.path.exists():
            return []
        if not self.path.is_dir():
            raise RegistryError(f"registry path {self.path} is not a directory")
        if not (self.path / ".git").exists():
            if any(self.path.iterdir()):
                raise RegistryError(f"{self.path} is not a kernel registry (not a git repository with a {MANIFEST_NAME})")
            return []
        rev = self._revision(revision)
        if rev is None:
            return []
        text = read_at(self.path, rev, MANIFEST_NAME)
        if text is None:
            raise RegistryError(f"{self.path} is not a kernel registry (commit {rev[:10]} has no {MANIFEST_NAME})")
        return parse_manifest(text, f"{self.manifest_path}@{rev[:10]}")

    def head(self) -> str | None:
        """The commit the registry serves now (None before its first commit)."""
        return self._revision(None) if (self.path / ".git").exists() else None

    def commit_of(self, revision: str) -> str | None:
        """The full sha `revision` (a sha, or a ref like HEAD~1) names; RegistryError for an unknown one."""
        return self._revision(revision)

    def uncommitted(self) -> list[str]:
        """Files edited by hand and not committed (never served; writers refuse to run over them)."""
        return changed_paths(self.path) if (self.path / ".git").exists() else []

    def find(self, entry_id: str) -> Entry:
        """The entry whose id (or a unique prefix of it) is `entry_id`."""
        matches = [e for e in self.entries() if e.id.startswith(entry_id)]
        if len(matches) != 1:
            if not matches and (gone := self.removed_by(entry_id)) is not None:
                raise RegistryError(f"entry {entry_id} is no longer in {self.path}: {gone.message.splitlines()[0]} "
                                    f"({gone.sha[:10]}) removed it")
            what = "no entry" if not matches else f"{len(matches)} entries"
            raise RegistryError(f"{what} in {self.path} matches {entry_id!r}")
        return matches[0]

    def select(self, op: str, fingerprint: str, dtype: str, bucket: str) -> Entry | None:
        """The entry serving this (op, device fingerprint, dtype, bucket); None means baseline."""
        return select_entry(self.entries(), op, fingerprint, dtype, bucket)

    def source(self, entry: Entry, revision: str | None = None) -> str:
        """The entry's kernel source as commit `revision` (default HEAD) holds it."""
        rev = self._revision(revision)
        text = read_at(self.path, rev, entry.source_path) if rev is not None else None
        if text is None:
            raise RegistryError(f"{entry.id}: source {entry.source_path} is not in the registry's commit "
                                f"{(rev or 'HEAD')[:10]}")
        return text

    def checked_source(self, entry: Entry, revision: str | None = None) -> str:
        """`source()`, refused (RegistryError) when it does not hash to the manifest's sha256."""
        text = self.source(entry, revision)
        if sha256_text(text) != entry.sha256:
            raise RegistryError(f"{entry.id}: source {entry.source_path} does not match its sha256")
        return text

    def load(self, entry: Entry, revision: str | None = None) -> Callable | None:
        """The entry's `forward`, or None (logged) when its source is missing, altered or broken."""
        try:
            return load_forward(self.source(entry, revision), entry.sha256, entry.id, entry.op)
        except RegistryError as exc:
            log.error("refusing registry kernel: %s; using the baseline", exc)
            return None

    def history(self, limit: int | None = None) -> list[Commit]:
        if not (self.path / ".git").exists():
            return []
        repo = git.Repo(self.path)
        try:
            return [self._as_commit(c) for c in repo.iter_commits(max_count=limit)]
        finally:
            repo.close()

    def added_by(self, entry: Entry) -> Commit:
        """The oldest commit that made `entry` current."""
        repo = git.Repo(self.path)
        try:
            return self._as_commit(self._commit_adding(repo, entry))
        finally:
            repo.close()

    def removed_by(self, entry_id: str) -> Commit | None:
        """The newest commit that dropped an entry whose id starts with `entry_id` (a rollback or a
        replacement); None when no commit ever held such an entry."""
        if not entry_id or not (self.path / ".git").exists():
            return None
        repo = git.Repo(self.path)
        try:
            for commit in repo.iter_commits(paths=MANIFEST_NAME):
                if not commit.parents:
                    continue
                had = any(e.id.startswith(entry_id) for e in self._entries_at(commit.parents[0]).values())
                if had and not any(e.id.startswith(entry_id) for e in self._entries_at(commit).values()):
                    return self._as_commit(commit)
            return None
        finally:
            repo.close()

    # -- writing ---------------------------------------------------------------------------

    def add(
        self,
        op: str,
        source: str,
        *,
        device: Fingerprint,
        dtype: str,
        bucket: str,
        speedup: float,
        speedup_ci: tuple[float, float],
        provenance: Provenance,
        verified_at: str | None = None,
        batch_invariant: bool | None = None,
    ) -> Added:
        """Store a verified kernel, replacing the entry for the same key; one commit, returned with it.
        `batch_invariant`: what its verdict says (None: not probed)."""
        entry = Entry(
            op=op, device=device, dtype=dtype, bucket=bucket, sha256=sha256_text(source),
            speedup=speedup, speedup_ci=tuple(speedup_ci), provenance=provenance,
            verified_at=verified_at or utc_now(), batch_invariant=batch_invariant,
        )
        with self._writing() as repo:
            entries = [e for e in self.entries() if e.key != entry.key] + [entry]
            atomic_write(self.path / entry.source_path, source)
            atomic_write(self.manifest_path, render_manifest(entries))
            message = f"Add {op} for {device} {dtype} [{bucket}]: {speedup:.2f}x ({entry.id})"
            sha = self._commit(repo, [entry.source_path, MANIFEST_NAME], message)
        return Added(entry, sha)

    def replace_scoped(self, fingerprint: Fingerprint, dtype: str, entries: list[tuple[Entry, str]], message: str) -> str:
        """Make `entries` (each with its source text; every one scoped) the scoped entries of (device fingerprint,
        dtype), dropping the scoped ones there before; one commit, whose sha is returned. An empty list
        removes the selection. Unscoped entries and other devices' are kept."""
        if any(not e.scope or e.device != fingerprint or e.dtype != dtype for e, _ in entries):
            raise RegistryError(f"replace_scoped: every entry must be scoped and for {fingerprint} {dtype}")
        with self._writing() as repo:
            kept = [e for e in self.entries() if not (e.scope and e.device == fingerprint and e.dtype == dtype)]
            paths = [MANIFEST_NAME]
            for entry, source in entries:
                if sha256_text(source) != entry.sha256:
                    raise RegistryError(f"replace_scoped: {entry.scope}: source does not match its sha256")
                if entry.source_path not in paths:
                    atomic_write(self.path / entry.source_path, source)
                    paths.append(entry.source_path)
            atomic_write(self.manifest_path, render_manifest(kept + [e for e, _ in entries]))
            return self._commit(repo, paths, message)

    def rollback(self, target: str) -> Commit:
        """Undo the commit `target` (a commit sha, or an entry id: the commit that added it)."""
        with self._writing() as repo:
            commit = self._resolve_commit(repo, target)
            if not commit.parents:
                raise RegistryError("the registry's first commit cannot be rolled back")
            before = self._entries_at(commit.parents[0])
            after = self._entries_at(commit)
            current = {e.key: e for e in self.entries()}
            for key in set(before) | set(after):
                if before.get(key) == after.get(key):
                    continue
                if current.get(key) != after.get(key):
                    raise RegistryError(
                        f"cannot roll back {commit.hexsha[:10]}: {'/'.join(k for k in key if k)} changed again since; "
                        "roll back the later commit first"
                    )
                if key in before:
                    current[key] = before[key]
                else:
                    current.pop(key, None)
            atomic_write(self.manifest_path, render_manifest(list(current.values())))
            subject = commit.message.strip().splitlines()[0]
            message = f'Revert "{subject}"\n\nThis reverts commit {commit.hexsha}.'
            sha = self._commit(repo, [MANIFEST_NAME], message)
        return Commit(sha, message, utc_now())

    # -- internals -------------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[git.Repo]:
        # The lock is on the registry directory itself, so initialisation is covered too.
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            repo = self._open_or_init()
            if dirty := self.uncommitted():
                raise RegistryError(
                    f"the registry at {self.path} has uncommitted changes ({', '.join(dirty[:3])}"
                    f"{', ...' if len(dirty) > 3 else ''}); commit them or discard them with "
                    f"`git -C {self.path} checkout -- .` (nothing was written)")
            try:
                yield repo
            finally:
                repo.close()
        finally:
            os.close(fd)  # closing releases the lock

    def _open_or_init(self) -> git.Repo:
        if (self.path / ".git").exists():
            return git.Repo(self.path)
        if any(p.name != ".git" for p in self.path.iterdir()):
            raise RegistryError(f"{self.path} is not empty and not a kernel registry; refusing to initialise it")
        repo = git.Repo.init(self.path, initial_branch="main")
        atomic_write(self.manifest_path, render_manifest([]))
        self._commit(repo, [MANIFEST_NAME], "Initialise kernel registry")
        return repo

    @staticmethod
    def _commit(repo: git.Repo, paths: list[str], message: str) -> str:
        repo.index.add(paths)
        return repo.index.commit(message, author=ACTOR, committer=ACTOR).hexsha

    def _resolve_commit(self, repo: git.Repo, target: str) -> git.Commit:
        if any(e.id.startswith(target) for e in self.entries()):
            return self._commit_adding(repo, self.find(target))
        try:
            return repo.commit(target)
        except (git.BadName, ValueError):
            pass
        if (gone := self.removed_by(target)) is not None:
            raise RegistryError(f"entry {target} is not in the registry any more: already rolled back or replaced by "
                                f"{gone.sha[:10]} ({gone.message.splitlines()[0]}); nothing to do")
        raise RegistryError(f"{target!r} is neither an entry id nor a commit of {self.path}")

    def _commit_adding(self, repo: git.Repo, entry: Entry) -> git.Commit:
        # The oldest commit that introduced it: rolling back an entry means "stop using it", even when
        # a later revert-of-a-revert brought it back.
        for commit in reversed(list(repo.iter_commits(paths=MANIFEST_NAME))):
            parent = self._entries_at(commit.parents[0]) if commit.parents else {}
            if self._entries_at(commit).get(entry.key) == entry and parent.get(entry.key) != entry:
                return commit
        raise RegistryError(f"no commit in {self.path} added {entry.id}")

    def _revision(self, revision: str | None) -> str | None:
        try:
            return resolve(self.path, revision or "HEAD")
        except RegistryError:
            if revision is None:
                return None  # a repository without commits yet
            raise

    @staticmethod
    def _as_commit(commit: git.Commit) -> Commit:
        return Commit(commit.hexsha, commit.message.strip(), commit.committed_datetime.isoformat())

    @staticmethod
    def _entries_at(commit: git.Commit) -> dict[tuple, Entry]:
        try:
            blob = commit.tree / MANIFEST_NAME
        except KeyError:
            return {}
        text = blob.data_stream.read().decode("utf-8")
        return {e.key: e for e in parse_manifest(text, f"{MANIFEST_NAME}@{commit.hexsha[:10]}")}
