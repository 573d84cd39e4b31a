"""Choosing which projections to quantize: the most bytes saved under a KL budget.

Each projection's schemes form a ladder (full precision, then the schemes saving more bytes, kept where each rung
buys bytes at a better rate than the ones above it: the lower convex hull of solo KL against bytes saved). Greedy
climbs the rungs of every ladder together, best bytes per nat first, while the sum of the solo KLs of the rungs
taken stays under the budget; so a projection ends at most at one scheme, and int4 is chosen where its extra bytes
over int8 are cheap enough, not only where int4 alone beats int8 per nat. The climb also stops at the knee: the first
rung costing more than KNEE_FACTOR times the nats per byte of the selection so far (doubling the KL there would buy
less than 1/KNEE_FACTOR more bytes). A selection filled to the budget's edge with such rungs saves a few MiB more and
is as likely as not to be over the budget on the next prompts (docs/benchmarks/2026-12-04-cpu-interpreter-quantize-e2e.md).
KL is not additive (errors of several layers interact), so the whole selection is then measured, and while its upper confidence bound is over the budget
the least efficient rungs are stepped back down (enough that their estimated share matches the excess) and it is
measured again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from kernelloop.agent.quantize.measure import Quality, Sensitivity
from kernelloop.common.progress import Progress

KL_FLOOR = 1e-9  # a solo KL (or a rung's extra KL) at or below this (rounding noise) ranks as this
MAX_REPAIRS = 12
KNEE_FACTOR = 30.0  # 0: no knee, fill the budget
KNEE_KL_FLOOR = 0.01  # of the budget: the selection's KL the knee compares against is at least this share of it


def efficiency(s: Sensitivity) -> float:
    """Bytes saved per nat of KL."""
    return s.saved / max(s.kl, KL_FLOOR)


@dataclass(frozen=True)
class Rung:
    """One step up a projection's ladder: to `to`, saving `extra_bytes` more than the rung below for `extra_kl`
    more solo KL."""

    to: Sensitivity
    extra_bytes: int
    extra_kl: float
    height: int  # 0 for the first rung above full precision

    @property
    def efficiency(self) -> float:
        return self.extra_bytes / max(self.extra_kl, KL_FLOOR)


def ladder(options: list[Sensitivity]) -> list[Rung]:
    """One projection's schemes as rungs of non-increasing bytes per nat: from full precision, each time the
    scheme saving more bytes at the best rate over the current rung; schemes never worth a step are left out."""
    rungs: list[Rung] = []
    saved, kl = 0, 0.0
    while True:
        above = [s for s in options if s.saved > saved]
        if not above:
            return rungs
        rate = lambda s, saved=saved, kl=kl: (s.saved - saved) / max(max(s.kl, 0.0) - kl, KL_FLOOR)  # noqa: E731
        best = max(above, key=lambda s: (rate(s), s.saved))
        rungs.append(Rung(best, best.saved - saved, max(max(best.kl, 0.0) - kl, 0.0), len(rungs)))
        saved, kl = best.saved, max(kl, max(best.kl, 0.0))


def greedy_rungs(sens: list[Sensitivity], budget: float, knee: float = KNEE_FACTOR) -> list[Rung]:
    """The rungs taken, most efficient first: every projection's ladder climbed together while the sum of the
    taken rungs' extra KL stays within `budget`; a projection whose next rung does not fit climbs no further. With
    `knee` > 0 the climb ends at the first rung whose bytes per nat are under 1/`knee` of the taken rungs' together
    (their KL counted as at least KNEE_KL_FLOOR of the budget, so that free rungs do not set the bar)."""
    by_scope: dict[str, list[Sensitivity]] = {}
    for s in sens:
        by_scope.setdefault(s.scope, []).append(s)
    rungs = [r for options in by_scope.values() for r in ladder(options)]
    rungs.sort(key=lambda r: (-r.efficiency, r.height))
    taken: list[Rung] = []
    height: dict[str, int] = {}
    stuck: set[str] = set()
    total, saved = 0.0, 0
    for r in rungs:
        scope = r.to.scope
        if scope in stuck or r.height != height.get(scope, 0):
            continue
        if knee > 0 and taken and r.efficiency * knee < saved / max(total, KNEE_KL_FLOOR * budget, KL_FLOOR):
            break
        if total + r.extra_kl > budget:
            stuck.add(scope)
            continue
        taken.append(r)
        height[scope] = r.height + 1
        total += r.extra_kl
        saved += r.extra_bytes
    return taken


def knee_report(sens: list[Sensitivity], budget: float, knee: float, taken: list[Rung]) -> dict[str, Any]:
    """What the knee left within the budget: the rungs filling it would have added, their bytes and solo KL."""
    filled = greedy_rungs(sens, budget, knee=0.0)
    kept = {(r.to.scope, r.height) for r in taken}
    left = [r for r in filled if (r.to.scope, r.height) not in kept]
    return {"factor": knee, "stopped_before": f"{left[0].to.scope}:{left[0].to.scheme}" if left else None,
            "left_rungs": len(left), "left_bytes": sum(r.extra_bytes for r in left),
            "left_kl": sum(r.extra_kl for r in left)}


def top_of(rungs: list[Rung]) -> list[Sensitivity]:
    """Each projection's highest rung taken (its chosen scheme), in the order projections were first taken."""
    top: dict[str, Sensitivity] = {}
    for r in rungs:
        top[r.to.scope] = r.to
    return list(top.values())


def greedy(sens: list[Sensitivity], budget: float, knee: float = KNEE_FACTOR) -> list[Sensitivity]:
    """The chosen sensitivities: one scheme per projection, the sum of the rungs' solo KLs within `budget`."""
    return top_of(greedy_rungs(sens, budget, knee))


@dataclass
class Selection:
    chosen: list[Sensitivity]              # one per projection, in the order they were first taken
    measured: Quality                      # the whole selection, measured together
    budget: float
    repairs: list[dict[str, Any]] = field(default_factory=list)  # each: rungs stepped down, KL before and after
    knee: dict[str, Any] = field(default_factory=dict)  # knee_report: what stopping at the knee left unspent

    @property
    def plan(self) -> dict[str, str]:
        return {s.scope: s.scheme for s in self.chosen}

    @property
    def bytes_saved(self) -> int:
        return sum(s.saved for s in self.chosen)

    @property
    def within_budget(self) -> bool:
        """The measured KL's upper confidence bound is within the budget (so the mean is, with margin)."""
        return self.measured.kl_upper <= self.budget

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "bytes_saved": self.bytes_saved, "budget": self.budget,
                "measured": self.measured.to_json(), "repairs": self.repairs, "knee": self.knee,
                "chosen": [s.to_json() for s in self.chosen]}


def select(sens: list[Sensitivity], budget: float, measure: Callable[[dict[str, str]], Quality],
           progress: Progress = lambda message: None, knee: float = KNEE_FACTOR) -> Selection:
    """Greedy (up to the knee), then measured as a whole and repaired until the measured KL's upper bound is within
    `budget` (or nothing is left). `measure(plan)` is `measure.quality` on the validation prompts."""
    rungs = greedy_rungs(sens, budget, knee)
    selection = Selection(top_of(rungs), measure({s.scope: s.scheme for s in top_of(rungs)}), budget,
                          knee=knee_report(sens, budget, knee, rungs) if knee > 0 else {"factor": 0.0})
    if selection.knee.get("left_rungs"):
        k = selection.knee
        progress(f"stopped at the knee before {k['stopped_before']}: filling the budget would add "
                 f"{k['left_rungs']} rungs, {k['left_bytes'] / 2**20:.1f} MiB for {k['left_kl']:.2e} nats of solo KL")
    progress(f"greedy choice: {len(selection.chosen)} projections, {selection.bytes_saved / 2**20:.1f} MiB saved, "
             f"KL {selection.measured.kl:.2e} nats measured (upper bound {selection.measured.kl_upper:.2e}, "
             f"budget {budget:.2e})")
    for _ in range(MAX_REPAIRS):
        if selection.within_budget or not rungs:
            break
        estimated = sum(r.extra_kl for r in rungs)
        excess = estimated * (1 - budget / selection.measured.kl_upper)  # the estimated share to remove
        down, removed = [], 0.0
        while rungs and (removed < excess or not down):
            r = rungs.pop()  # the least efficient; a projection's higher rung always comes after its lower
            down.append(r)
            removed += r.extra_kl
        before = selection.measured
        selection.chosen = top_of(rungs)
        nothing = Quality(0.0, 1.0, before.positions)  # no projection quantized: the unquantized model
        selection.measured = measure(selection.plan) if selection.chosen else nothing
        selection.repairs.append({"stepped_down": [f"{r.to.scope}:{r.to.scheme}" for r in down],
                                  "kl_before": before.kl, "kl_after": selection.measured.kl,
                                  "kl_upper_after": selection.measured.kl_upper})
        progress(f"repair: stepped {len(down)} down, KL {before.kl:.2e} -> {selection.measured.kl:.2e} nats "
                 f"(upper bound {selection.measured.kl_upper:.2e})")
    if not math.isfinite(selection.measured.kl):
        raise ValueError("the selection's KL is not finite")
    return selection
