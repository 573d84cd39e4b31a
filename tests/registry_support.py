"""Registry test helpers: a commit made by hand, as a person editing the registry would."""

from __future__ import annotations

import git

from kernelloop.kernels.registry import Registry


def commit_by_hand(reg: Registry, message: str = "hand edit") -> None:
    repo = git.Repo(reg.path)
    try:
        repo.git.add("-A")
        repo.git.commit("-q", "-m", message, "--author", "someone <someone@example.com>")
    finally:
        repo.close()
