"""Which judged candidates may win a tune run: the accepted ones, and with `--batch-invariant` only
those whose verdict proved them batch invariant (sandbox/judge/batch_invariance.py)."""

from __future__ import annotations

from typing import Any


def winners(judged: list[dict[str, Any]], batch_invariant: bool = False) -> list[dict[str, Any]]:
    """The judged entries ({..., "verdict": trimmed verdict}) that may be committed."""
    return [j for j in judged if j["verdict"]["accepted"]
            and (not batch_invariant or j["verdict"].get("batch_invariant") is True)]
