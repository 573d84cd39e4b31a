"""Serving throughput over HTTP with the shadow audit's sampling at several `--audit-rate`s.

One `engine serve` process per rate, all started up front; each round sends the same batch of requests to
every server in turn (the order rotates from round to round, so drift on a noisy machine falls on every
rate alike) and records output tokens per second. Each rate's per-round ratio to rate 0 gives a median
with its distribution-free 95% interval (kernelloop/common/stats.py median_interval). The audit's promise: at the default
rate (0.01) serving is not slower by more than 2%.

This times the engine's side: the draw per finished request and the copy of a sampled one into the ring.
The auditor (`agent audit` / the daemon) scores samples in its own process, one reference forward per
sampled request (about 1% of serving's forwards at the default rate, prefill-sized).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Sequence

from kernelloop.common.stats import median_interval

from bench.http_load import EngineServer, PlannedRequest, send_all
from bench.report import print_table, write_report

NAME = "audit-overhead"
MICRO_CALLS = 20_000


def sampling_us(rate: float, prompt_tokens: int, max_tokens: int, calls: int = MICRO_CALLS) -> float:
    """Microseconds the server spends per finished request on the audit at `rate` (the draw, and for a
    sampled request its copy into the ring), timed in-process: the noise-free part of the comparison."""
    from kernelloop.engine import audit_endpoint
    from kernelloop.engine.audit_queue import AuditQueue
    from kernelloop.engine.engine import StepOutput

    queue = AuditQueue(rate, seed=0)
    engine = SimpleNamespace(kernels=SimpleNamespace(commit="c" * 40))
    body = SimpleNamespace(temperature=0.0, response_format=None)
    out = StepOutput("r", list(range(max_tokens)), "", [None] * max_tokens, True, "length")
    prompt = list(range(prompt_tokens))
    start = time.perf_counter()
    for _ in range(calls):
        audit_endpoint.sample(queue, engine, body, prompt, out)
    return (time.perf_counter() - start) / calls * 1e6


def requests(n: int, prompt_tokens: int, max_tokens: int) -> list[PlannedRequest]:
    return [PlannedRequest(0.0, [(7 * i + j) % 400 + 5 for j in range(prompt_tokens)], max_tokens) for i in range(n)]


def measure(rates: list[float], rounds: int, batch: list[PlannedRequest], model: str | None,
            threads: int | None) -> dict[float, list[float]]:
    """Output tokens per second per rate, one figure per round."""
    tps: dict[float, list[float]] = {rate: [] for rate in rates}
    with ExitStack() as stack:
        bases = {rate: stack.enter_context(EngineServer(model, threads, extra=["--audit-rate", str(rate)]))
                 for rate in rates}
        for base in bases.values():  # untimed warm-up
            send_all(base, batch[:2])
        for r in range(rounds):
            order = rates[r % len(rates):] + rates[:r % len(rates)]
            for rate in order:
                seconds, results = send_all(bases[rate], batch)
                tps[rate].append(sum(x.output_tokens for x in results) / seconds)
            print(f"round {r + 1}/{rounds}: " + ", ".join(f"rate {k:g}: {v[-1]:.1f} tok/s" for k, v in tps.items()),
                  file=sys.stderr, flush=True)
    return tps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0,0.01,1", help="audit rates, comma-separated; the first is the base")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=16, help="requests per round, sent at once")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", default=None, help="model directory or name (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out-dir", default=None, help="where the report goes (default docs/benchmarks)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    tps = measure(rates, args.rounds, requests(args.requests, args.prompt_tokens, args.max_tokens), args.model,
                  args.threads)
    base = tps[rates[0]]
    base_tps = sorted(base)[len(base) // 2]
    request_us = args.max_tokens / base_tps * 1e6  # serving time per request at the base rate's median throughput
    rows = []
    for rate in rates:
        ratio, lo, hi = median_interval([b / x for b, x in zip(base, tps[rate])])  # > 1: slower than the base
        us = sampling_us(rate, args.prompt_tokens, args.max_tokens)
        rows.append({"audit rate": rate, "median tok/s": sorted(tps[rate])[len(tps[rate]) // 2],
                     f"slowdown vs rate {rates[0]:g}": f"{ratio:.3f}x [{lo:.3f}, {hi:.3f}]", "rounds": len(tps[rate]),
                     "audit us/request": f"{us:.2f}", "share of a request": f"{us / request_us:.5%}"})
    print_table(rows)
    notes = [f"{args.requests} requests of {args.prompt_tokens} prompt tokens and {args.max_tokens} output tokens "
             "per round, streamed, all sent at once; one engine per rate, rounds interleaved with a rotating order.",
             f"slowdown: per-round time ratio (rate {rates[0]:g} tok/s / this rate's tok/s), median and 95% "
             "order-statistic interval.",
             "Engine side only: the auditor's reference forwards run in its own process.",
             f"audit us/request: the server's audit work per finished request, timed in-process over {MICRO_CALLS} "
             "requests (the seeded draw; for a sampled one, its copy into the ring). share of a request: that over "
             "the serving time of one request at the base rate's median throughput (max tokens / tok/s): the part of "
             "the comparison a noisy machine cannot blur."]
    path = write_report(NAME, "Shadow-audit sampling overhead on serving", rows, device="cpu", notes=notes,
                        out_dir=args.out_dir, interpreter_timings=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
