"""What every proposer takes and returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Proposal:
    """One candidate kernel module (the candidate format's source text) and where it came from."""

    source: str
    proposer: str
    label: str
    model: str | None = None
    prompt: str | None = None
    tokens_prompt: int | None = None
    tokens_completion: int | None = None


@dataclass(frozen=True)
class TuneContext:
    """What a proposer knows about the op it is tuning: spec name, target, profile, current kernel, history."""

    op: str
    dtype: str
    device: str
    shapes: tuple[dict, ...]       # shapes the engine profile saw, hottest first
    best_source: str | None        # current kernel (registry entry) or None = op baseline
    baseline_source: str           # kernels/ops/<op>.py source text
    roofline: dict                 # {"bytes_per_s", "roofline_pct", "device_bytes_per_s"} of the current kernel, may be {}
    failures: tuple[dict, ...]     # earlier failed attempts from history: {"source", "failure", "reason"}
