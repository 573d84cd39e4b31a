"""What every proposer takes and returns: `TuneContext` in, `Proposal`s out, and the `Proposer`
protocol the tune loop holds them by (agent/loop/nodes.py; `LoopContext.proposers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kernelloop.kernels.device import Device
    from kernelloop.kernels.spec import OpSpec


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
    """What a proposer knows about the op it is tuning: its spec, target, profile, current kernel, history."""

    spec: OpSpec                   # resolved by the loop from the state's op name; `op` is its name
    dtype: str
    device: Device
    shapes: tuple[dict, ...]       # shapes the engine profile saw, hottest first
    best_source: str | None        # current kernel (registry entry) or None = op baseline
    baseline_source: str           # kernels/ops/<op>_kernel.py source text
    roofline: dict                 # {"bytes_per_s", "roofline_pct", "device_bytes_per_s"} of the current kernel, may be {}
    failures: tuple[dict, ...]     # earlier failed attempts from history: {"source", "failure", "reason"}
    batch_invariant: bool = False  # only batch-invariant winners count (agent tune --batch-invariant)

    @property
    def op(self) -> str:
        return self.spec.name


Feedback = list[tuple[Proposal, dict[str, Any]]]  # (an earlier proposal, the verdict JSON it got), oldest first


@runtime_checkable
class Proposer(Protocol):
    """A source of candidate kernels, as the tune loop uses one (agent/loop/nodes.py, one call per round).

    `propose(ctx, feedback, n)` returns up to `n` new candidate modules for `ctx.op` (candidate format,
    each with this proposer's name in `Proposal.proposer`); [] when it has nothing new. `feedback` is
    this proposer's earlier proposals in the run, each with the verdict JSON it got (the sandbox's, or
    a proposal verdict from agent/proposers/feedback.py), oldest first.
    `rejected` is the last propose()'s answers that were not candidates (no code, cut off, ...), each
    with its proposal verdict JSON: the loop records them in the history; [] for a proposer that
    never rejects.
    `last_error` is one line saying why the last propose() could not do its job (endpoint trouble, an
    exhausted token budget), else None; each propose() resets it.
    `close()` releases what the proposer holds (an HTTP client); idempotent, may do nothing; called
    once the run is over.
    """

    last_error: str | None
    rejected: Feedback

    def propose(self, ctx: TuneContext, feedback: Feedback, n: int) -> list[Proposal]: ...

    def close(self) -> None: ...


def _members() -> tuple[str, ...]:
    methods = [k for k, v in vars(Proposer).items() if callable(v) and not k.startswith("_")]
    return tuple(sorted({*Proposer.__annotations__, *methods}))


def check_proposers(proposers: Mapping[str, object]) -> dict[str, Proposer]:
    """`proposers` as they are, once each is seen to have every member of `Proposer`; TypeError naming
    the first that lacks some (and what it lacks)."""
    checked: dict[str, Proposer] = {}
    for name, proposer in proposers.items():
        if not isinstance(proposer, Proposer):
            missing = ", ".join(m for m in _members() if not hasattr(proposer, m))
            raise TypeError(f"proposer {name!r} ({type(proposer).__name__}) is not a Proposer: it lacks {missing}")
        checked[name] = proposer
    return checked
