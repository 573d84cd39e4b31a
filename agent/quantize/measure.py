"""Measuring what quantizing some projections does to the model's next-token distribution.

A calibration is a set of prompts, each with the unquantized engine's greedy continuation and its log-distribution
at every continuation position. A plan (scope -> scheme) is measured by teacher forcing the same continuations
through the engine with those projections quantized (one batched forward): its quality is the mean over positions
of KL(unquantized || quantized), in nats, with its standard error (positions of one prompt are not independent,
so prompts are the clusters when there are two or more), and the share of positions whose argmax is unchanged
(greedy agreement, teacher-forced). A projection's sensitivity is the quality of the plan that quantizes only it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from kernelloop.common.progress import Progress, Step
from kernelloop.kernels.quant import Scheme

Pair = tuple[list[int], list[int]]  # (prompt ids, continuation ids)


class QuantizableEngine(Protocol):
    """What measuring needs of an engine (agent/local_engine.py LocalEngine)."""

    weight_itemsize: int

    def projections(self) -> dict[str, tuple[int, int]]: ...
    def generate(self, prompt_ids: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]: ...
    def planned_logprobs(self, pairs: list[Pair], plan: dict[str, str]) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class Calibration:
    pairs: list[Pair]
    reference: list[torch.Tensor]  # per pair: [len(continuation), vocab] log-probs of the unquantized engine

    @property
    def positions(self) -> int:
        return sum(len(c) for _, c in self.pairs)

    def first(self, n: int | None) -> "Calibration":
        """The first `n` prompts (all of them when `n` is None)."""
        return self if n is None else Calibration(self.pairs[:n], self.reference[:n])


Z_UPPER = 1.645  # one-sided 95%: the selection must fit the budget at the mean's upper bound, not only at the mean


@dataclass(frozen=True)
class Quality:
    kl: float         # mean over positions of KL(unquantized || quantized), nats
    agreement: float  # share of positions whose argmax is the unquantized one
    positions: int
    kl_se: float = 0.0  # the mean's standard error

    @property
    def kl_upper(self) -> float:
        return self.kl + Z_UPPER * self.kl_se

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kl_upper": self.kl_upper}


@dataclass(frozen=True)
class Sensitivity:
    scope: str
    scheme: str
    kl: float
    agreement: float
    bytes_full: int       # the projection's weight in the serving dtype
    bytes_quantized: int  # in the scheme: values plus scales

    @property
    def saved(self) -> int:
        return self.bytes_full - self.bytes_quantized

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "saved": self.saved}


def calibrate(engine: QuantizableEngine, prompts: list[list[int]], tokens: int) -> Calibration:
    """Greedy continuations of `tokens` (EOS ends one early) and the unquantized distributions along them."""
    continuations = engine.generate(prompts, tokens, [None] * len(prompts))
    pairs = [(list(p), list(c)) for p, c in zip(prompts, continuations)]
    return Calibration(pairs, engine.planned_logprobs(pairs, {}))


def compare(reference: list[torch.Tensor], other: list[torch.Tensor]) -> Quality:
    """KL(reference || other) averaged over every position, its standard error, and the argmax agreement."""
    per_prompt: list[torch.Tensor] = []
    agree = 0
    for ref, oth in zip(reference, other):
        if not len(ref):
            continue
        r, o = ref.double(), oth.double()
        per_prompt.append((r.exp() * (r - o)).sum(-1))
        agree += int((r.argmax(-1) == o.argmax(-1)).sum())
    n = sum(len(k) for k in per_prompt)
    if not n:
        return Quality(0.0, 1.0, 0)
    mean = float(torch.cat(per_prompt).mean())
    return Quality(max(mean, 0.0), agree / n, n, standard_error(per_prompt, mean))


def standard_error(per_prompt: list[torch.Tensor], mean: float) -> float:
    """The cluster-robust standard error of the mean of every value, prompts as clusters (each position its own
    cluster when there is one prompt)."""
    clusters = per_prompt if len(per_prompt) > 1 else list(per_prompt[0].reshape(-1, 1))
    c, n = len(clusters), sum(len(k) for k in clusters)
    if c < 2:
        return 0.0
    sums = torch.stack([(k - mean).sum() for k in clusters])
    return float((sums.pow(2).sum() * c / (c - 1)).sqrt() / n)


def quality(engine: QuantizableEngine, calibration: Calibration, plan: dict[str, str]) -> Quality:
    """The quality of quantizing the projections of `plan` (scope -> scheme name) together."""
    return compare(calibration.reference, engine.planned_logprobs(calibration.pairs, plan))


def sensitivities(engine: QuantizableEngine, calibration: Calibration, schemes: list[Scheme],
                  progress: Progress = lambda message: None) -> list[Sensitivity]:
    """Every projection quantized alone, by every scheme that can hold it."""
    shapes = engine.projections()
    todo = [(scope, s) for scope, (n, k) in shapes.items() for s in schemes if s.applies(k)]
    out: list[Sensitivity] = []
    for i, (scope, s) in enumerate(todo, 1):
        n, k = shapes[scope]
        q = quality(engine, calibration, {scope: s.name})
        out.append(Sensitivity(scope, s.name, q.kl, q.agreement, n * k * engine.weight_itemsize, s.weight_bytes(n, k)))
        detail = f"{scope} {s.name}: KL {q.kl:.2e}, agreement {q.agreement:.2f}"
        progress(Step(f"  sensitivity {i}/{len(todo)} {detail}", "sensitivity", i, len(todo), detail=detail))
    return out
