"""What dispatch adds to a call: `python -m bench.dispatch_overhead [--calls N] [--out-dir DIR]`.

For each op the variant behind the dispatcher is a function that returns at once, so the measured
difference between `kd.<op>(*args)` and calling that function directly is the dispatcher's own
cost: computing the dispatch key, the cache lookup and the call through. Target: <= 2 us on CPU.
Also reported: the one-off cost of a cache miss (shape, bucket, registry selection).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any, Callable, Sequence

import torch

from kernelloop import kernels
from kernelloop.kernels.device import CPU
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.registry import Registry

from bench.report import print_table, write_report

TARGET_NS = 2000.0


def per_call_ns(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Best of `repeats` loops of `calls` calls: the least-disturbed estimate of one call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def measure_op(name: str, calls: int, repeats: int, registry: Registry) -> dict[str, Any]:
    spec = kernels.OPS[name]
    args = spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu")

    def instant(*a: Any) -> Any:
        return a[0]

    fake = dataclasses.replace(spec, forward=instant, reference=instant)
    kd = Dispatcher("registry", registry=registry, device=CPU, ops={name: fake})
    op = kd.ops[name]
    start = time.perf_counter_ns()
    op(*args)  # the miss: resolves and caches
    miss_ns = time.perf_counter_ns() - start
    loop_ns = per_call_ns(lambda: None, calls, repeats)  # the measuring loop's own cost
    direct = per_call_ns(lambda: instant(*args), calls, repeats) - loop_ns
    dispatched = per_call_ns(lambda: op(*args), calls, repeats) - loop_ns
    return {
        "op": name,
        "direct ns": round(direct),
        "dispatched ns": round(dispatched),
        "overhead ns": round(dispatched - direct),
        "within 2 us": "yes" if dispatched - direct <= TARGET_NS else "NO",
        "first call (miss) us": round(miss_ns / 1000, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timing loop")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out-dir", default=None, help="where the report goes (default docs/benchmarks)")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        registry = Registry(tmp)  # empty: the chain is baseline, reference (a registry read per miss)
        rows = []
        for name in kernels.OPS:
            print(f"timing dispatch of {name} ...", file=sys.stderr, flush=True)
            rows.append(measure_op(name, args.calls, args.repeats, registry))
    print_table(rows)
    notes = [
        "The variant behind the dispatcher returns at once, so `overhead ns` is dispatch alone.",
        f"Each figure is the best of {args.repeats} loops of {args.calls} calls, minus an empty loop's cost.",
        "This measures Python-level host overhead; it is the same on a GPU machine's host CPU modulo clock speed.",
    ]
    path = write_report("dispatch-overhead", "Dispatch overhead per call", rows, device="cpu", notes=notes,
                        out_dir=args.out_dir, interpreter_timings=False)
    print(f"wrote {path}")
    return 0 if all(r["within 2 us"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
