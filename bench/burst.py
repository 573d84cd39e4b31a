"""A burst over HTTP, the rows `bench.engine_throughput` reports:

- burst: N clients each send one greedy request at the same moment (prompts of 16-64 random tokens,
  `new` tokens each) to `engine serve`, streamed or not; against transformers' `generate()` on the same
  prompts as one left-padded batch, in this process, same torch threads (bench.engine_throughput also
  gives them to an in-process Engine, which tells the HTTP layer's share apart). Each repeat draws fresh prompts, so
  the prefix cache does not help the engine.
- streams under a burst: `streams` requests decode (streamed, long outputs); once they are in steady
  state the burst arrives. TTFT p50/p99 of the burst's requests, and the inter-token latency p99 of
  the running streams while the burst is served, against their steady state before it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from bench.agent_workload import percentile
from bench.http_load import PlannedRequest, RequestResult, send_all, send_one_by_one

PROMPT_LENGTHS = (16, 64)


def burst_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of random token ids (special ids below 5 left out), 16-64 tokens each."""
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(*PROMPT_LENGTHS))] for _ in range(n)]


def http_burst(base: str, prompts: list[list[int]], new: int,
               stream: bool = True) -> tuple[float, int, list[RequestResult]]:
    """(seconds to the last response, output tokens, results): every prompt sent at once, streamed or not."""
    seconds, results = send_all(base, [PlannedRequest(0.0, p, new) for p in prompts], stream=stream)
    return seconds, sum(r.output_tokens for r in results), results


def lone_ttfts(base: str, vocab: int, n: int, seed: int) -> list[float]:
    """TTFT (seconds) of `n` requests sent one at a time, each alone on the server (2 new tokens each)."""
    _, results = send_one_by_one(base, [PlannedRequest(0.0, p, 2) for p in burst_prompts(n, vocab, seed)])
    return [r.ttft for r in results]


def hf_padded_batch(model, prompts: list[list[int]], new: int, pad_id: int) -> tuple[float, int]:
    """transformers' generate() on the prompts as one left-padded batch: (seconds, output tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=pad_id)
    return time.perf_counter() - start, len(prompts) * new


@dataclass(frozen=True)
class UnderBurst:
    ttft_p50: float  # seconds, the burst's requests
    ttft_p99: float
    itl_p99_steady: float  # seconds between the running streams' tokens before the burst arrived
    itl_p99_burst: float  # ... while the burst is served (from its arrival to its last request's end)


def gaps_around(streams: list[RequestResult], at: float, end: float) -> tuple[list[float], list[float]]:
    """The streams' inter-token gaps (seconds; their own prefill comes before their first token): those
    while the burst is served (a gap that ends after `at` and starts before `end`), and the steady ones,
    before or after it (when the burst arrives before the streams' first tokens, only after it)."""
    steady, during = [], []
    for r in streams:
        for a, b in zip(r.chunk_times, r.chunk_times[1:]):
            (during if b > at and a < end else steady).append(b - a)
    return steady, during


def streams_under_burst(base: str, running: list[list[int]], burst: list[list[int]], new: int,
                        at: float) -> UnderBurst:
    """`running` streams (long enough to outlast the burst) start at 0, the burst arrives at `at` s."""
    planned = [PlannedRequest(0.0, p, new * 16) for p in running] + [PlannedRequest(at, p, new) for p in burst]
    _, results = send_all(base, planned)
    streams, arrivals = results[:len(running)], results[len(running):]
    steady, during = gaps_around(streams, at, max(r.arrival + r.latency for r in arrivals))
    if not steady or not during:
        raise RuntimeError(f"the streams did not outlast the burst ({len(steady)} steady gaps, {len(during)} during)")
    ttfts = [r.ttft for r in arrivals]
    return UnderBurst(percentile(ttfts, 50), percentile(ttfts, 99), percentile(steady, 99), percentile(during, 99))
