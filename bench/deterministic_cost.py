"""The throughput cost of `engine serve --deterministic`: `python -m bench.deterministic_cost [--rounds N]`.

With the embedded model on CPU (float32, the CPU default kernels: reference torch ops), two engines in
one process, default and deterministic, generate the same greedy workloads (1 request; 16 concurrent
requests) in interleaved rounds, the order alternating each round. Per workload: output tokens/s of
each, and deterministic/default as the median of the per-round ratios with its distribution-free 95% interval
(kernelloop/common/stats.py). Deterministic mode serves linear and both attentions row by row (kernels/deterministic.py),
so the cost grows with the rows a forward carries: most in prefill and large batches.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from kernelloop.common.stats import median_interval
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.gate_invariance import fillers, greedy

from bench.report import print_table, write_report

WORKLOADS = (("1 request", 1), ("16 concurrent", 16))


def tokens_per_s(engine: Engine, prompts: list[list[int]], max_tokens: int) -> float:
    engine.cache.invalidate()  # every run prefills its prompts: the two engines do the same work
    start = time.perf_counter()
    reqs = engine.generate(prompts, greedy(max_tokens))
    return sum(len(r.output_ids) for r in reqs) / (time.perf_counter() - start)


def measure(model: str | None, rounds: int, max_tokens: int) -> list[dict]:
    engines = {"default": Engine(EngineConfig(model=model)),
               "deterministic": Engine(EngineConfig(model=model, deterministic=True))}
    rows = []
    for name, n in WORKLOADS:
        prompts = fillers(engines["default"].model_config.vocab_size, n, seed=7)
        for engine in engines.values():  # warm-up, untimed
            tokens_per_s(engine, prompts, 2)
        got: dict[str, list[float]] = {"default": [], "deterministic": []}
        for r in range(rounds):
            order = ("default", "deterministic") if r % 2 == 0 else ("deterministic", "default")
            for which in order:
                got[which].append(tokens_per_s(engines[which], prompts, max_tokens))
        ratio, lo, hi = median_interval([d / b for d, b in zip(got["deterministic"], got["default"])])
        rows.append({"workload": name, "default tok/s": round(sorted(got["default"])[rounds // 2], 1),
                     "deterministic tok/s": round(sorted(got["deterministic"])[rounds // 2], 1),
                     "deterministic/default": round(ratio, 3), "95% interval": f"[{lo:.3f}, {hi:.3f}]"})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deterministic_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for both engines (default 1: deterministic mode's row-by-row ops run on "
                             "one thread anyway; on a shared machine the thread pool's wake-ups swamp small ops)")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--no-report", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.model, args.rounds, args.max_tokens)
    print_table(rows)
    if not args.no_report:
        path = write_report(
            "deterministic-cost", "engine serve --deterministic: throughput against the default mode", rows,
            device="cpu", out_dir=args.out_dir, interpreter_timings=False,
            notes=[f"torch threads: {args.threads} for both engines.",
                   f"embedded model, float32, reference kernels (the CPU default); {args.max_tokens} greedy tokens per "
                   f"request, EOS ignored; {args.rounds} interleaved rounds, the order alternating.",
                   "deterministic: linear, extend_attention and decode_attention computed one row at a time on one "
                   "CPU thread (kernels/deterministic.py); rmsnorm, fused_add_rmsnorm, rope and silu_mul are "
                   "batch invariant as they are (the probe proves it) and unchanged.",
                   "ratio: median of per-round deterministic/default tokens/s, 95% order-statistic interval."])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
