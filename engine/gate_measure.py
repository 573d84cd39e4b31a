"""The quality gate's measurement, computed in one place for the in-process engine and for `POST /gate/measure`.

A measurement is the greedy decode of a set of prompts (EOS ignored) with, at every generated position,
the full next-token log-distribution: `torch.log_softmax(logits.double())`, float64, as the gate's KL
needs it (agent/gate.py). `LogprobCapture` is the `Engine.logits_hook` that computes those rows and
assembles the measurement; `measure()` drives it on an engine in this process (nothing else running),
engine/gate_endpoint.py drives the same capture alongside a server's live traffic, and `to_wire()` is
what the endpoint sends: each prompt's rows as base64 of float64 bytes (`"dtype": "float64"`), which
agent/remote.py decodes back bit for bit.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelloop.engine.engine import Engine
from kernelloop.engine.request import Request
from kernelloop.engine.sampling import SamplingParams

LOGPROB_DTYPE = torch.float64
WIRE_DTYPE = "float64"  # the numpy name of LOGPROB_DTYPE, as the endpoint's reply states it


@dataclass
class GateMeasurement:
    greedy: list[list[int]]                                   # per prompt: the generated token ids
    logprobs: list[torch.Tensor] = field(repr=False)          # per prompt: [positions, vocab] float64, on the CPU
    tokens_per_second: float                                  # generated tokens / wall seconds of the timed decode


def decode_params(max_tokens: int) -> SamplingParams:
    """Greedy, EOS ignored: every prompt yields exactly `max_tokens` positions (as far as the engine serves)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


RUNAWAY_TEMPERATURE = 0.8  # the sampled side of the gate's long generations (each with its own seed)


def long_params(max_tokens: int, seed: int | None) -> SamplingParams:
    """One long generation of the runaway check (agent/runaway.py): greedy when `seed` is None, else
    sampled at RUNAWAY_TEMPERATURE from the request's own generator; EOS ends it, as it would a user's."""
    if seed is None:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return SamplingParams(max_tokens=max_tokens, temperature=RUNAWAY_TEMPERATURE, seed=seed)


# Untimed first: a kernel's first call pays one-time costs (Triton's JIT, or the interpreter's rewrite of
# the kernel) that a freshly reloaded variant would otherwise carry into tokens/s.
WARMUP = decode_params(2)


class LogprobCapture:
    """An `Engine.logits_hook`: the float64 log-softmax of every sampled row of the requests it watches
    (`watch(rid)`; `watch_all` takes every request, for an engine that serves nothing else)."""

    def __init__(self, watch_all: bool = False) -> None:
        self.watch_all = watch_all
        self.rows: dict[str, list[torch.Tensor]] = {}

    def watch(self, rid: str) -> None:
        self.rows.setdefault(rid, [])

    def __call__(self, reqs: list[Request], logits: torch.Tensor) -> None:
        for req, row in zip(reqs, logits):
            if self.watch_all or req.rid in self.rows:
                self.rows.setdefault(req.rid, []).append(torch.log_softmax(row.to(LOGPROB_DTYPE), dim=-1).cpu())

    def measurement(self, rids: list[str], greedy: list[list[int]], seconds: float) -> GateMeasurement:
        """The measurement of requests `rids` (in prompt order), which generated `greedy` in `seconds`."""
        return GateMeasurement(greedy, [torch.stack(self.rows[rid]) for rid in rids],
                               sum(map(len, greedy)) / max(seconds, 1e-12))


def measure(engine: Engine, prompts: list[list[int]], max_tokens: int, warmup: bool = True) -> GateMeasurement:
    """The gate's measurement on an engine in this process: all prompts decoded as one batch (after an
    untimed warm-up pass unless `warmup` is false)."""
    if warmup:
        engine.generate(prompts, WARMUP)
    capture = LogprobCapture(watch_all=True)
    engine.logits_hook = capture
    try:
        start = time.perf_counter()
        reqs = engine.generate(prompts, decode_params(max_tokens))
        seconds = time.perf_counter() - start
    finally:
        engine.logits_hook = None
    return capture.measurement([r.rid for r in reqs], [list(r.output_ids) for r in reqs], seconds)


def generate(engine: Engine, prompts: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]:
    """The long generations of `prompts` (`seeds[i]`: long_params) on an engine in this process."""
    reqs = engine.generate(prompts, [long_params(max_tokens, seed) for seed in seeds])
    return [list(r.output_ids) for r in reqs]


def to_wire(measured: GateMeasurement) -> dict[str, Any]:
    """The measurement as `POST /gate/measure` replies (JSON): float64 rows, base64, one string per prompt."""
    vocab = measured.logprobs[0].shape[-1] if measured.logprobs else 0
    return {"greedy": measured.greedy, "tokens_per_second": measured.tokens_per_second, "vocab": vocab,
            "dtype": WIRE_DTYPE,
            "logprobs": [base64.b64encode(rows.to(LOGPROB_DTYPE).contiguous().numpy().tobytes()).decode()
                         for rows in measured.logprobs]}
