"""Batch invariance in the gate: a prompt's greedy tokens alone, inside a batch, and with a prefix-cache hit.

engine/gate_invariance.py takes the three decodes of each gate prompt; here they are compared. A
prompt diverges where its three token lists first disagree; the gate fails on a divergence the change
introduced (the prompt agreed before and not after), showing the first diverging token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WAYS = ("alone", "batch", "hit")  # how each prompt was decoded (engine/gate_invariance.py)


@dataclass(frozen=True)
class Divergence:
    """Where `way` first differs from decoding alone: token `position`, ids `alone` vs `other`."""

    way: str
    position: int
    alone: int | None  # None: that decode had ended
    other: int | None

    def describe(self) -> str:
        shown = "in a batch" if self.way == "batch" else "with a prefix-cache hit"
        return f"{shown} from token {self.position} ({self.alone} alone, {self.other} {self.way})"


def first_divergence(probe: dict[str, Any], prompt: int) -> Divergence | None:
    """The first place where prompt `prompt`'s batch or hit decode leaves its alone decode; None if all agree."""
    alone = probe["alone"][prompt]
    found = []
    for way in WAYS[1:]:
        other = probe[way][prompt]
        for i in range(max(len(alone), len(other))):
            a, b = (alone[i] if i < len(alone) else None), (other[i] if i < len(other) else None)
            if a != b:
                found.append(Divergence(way, i, a, b))
                break
    return min(found, key=lambda d: d.position) if found else None


def invariance_rows(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per prompt: its first divergence before and after (described, or None) and whether it is new."""
    rows = []
    for i in range(len(after["alone"])):
        b, a = first_divergence(before, i), first_divergence(after, i)
        rows.append({"prompt": i, "before": b.describe() if b else None, "after": a.describe() if a else None,
                     "new": a is not None and b is None, "cached": (after.get("cached") or [None] * (i + 1))[i]})
    return rows
