"""Cluster judge throughput: `python -m bench.cluster_throughput [--candidates N] [--timing] [--device D]
[--rehearse] [--out-dir DIR]`.

The same stream of distinct honest rmsnorm candidates (bench.sandbox_throughput's), with the same
options, judged three ways on this machine: by the local judge (one Sandbox in this process), and
through a Ray cluster started here (loopback, its own temp dir) by a JudgePool of 1 and of 2 actors.
Each judge first judges a warm-up candidate per actor (each builds its Sandbox, fork server included,
on its first job). Reported: candidates per minute from the start and over the warm stream alone, the
2-actor / 1-actor ratio of both, the cluster's own overhead per candidate (the 1-actor pool's median
interval between verdicts against the local judge's median per candidate), and the busy cores of each
stream with Ray's and the driver's share (bench.cpu_span). On `--device cuda` (a gpu_check step) the
pool has one actor per GPU; where Ray is not installed it prints a skip and exits 0. `--rehearse`: one
candidate after the warm-ups, on the CPU: the code path only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelloop.kernels.device import CPU, DEVICES
from kernelloop.sandbox import CheckOptions, Sandbox
from kernelloop.sandbox.cluster import ClusterJob, ClusterUnavailable, JudgePool
from kernelloop.sandbox.cluster.session import import_ray, keep_loopback

from bench.cpu_span import CpuSpan
from bench.report import print_table, write_report
from bench.sandbox_throughput import candidate_stream

TARGET_RATIO = 1.7      # 2 actors vs 1 on 2 idle cores
TARGET_OVERHEAD = 0.10  # the cluster's own cost per candidate, as a share of a local check


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def judge_local(sources: list[str], warmups: list[str], options: CheckOptions) -> dict[str, Any]:
    load = os.getloadavg()[0]
    start = time.monotonic()
    each, correct = [], 0
    with Sandbox(options) as sandbox:
        warm = sandbox.judge_source("rmsnorm", warmups[0], "warm-up.py").correct
        warm_at = time.monotonic()
        with CpuSpan() as span:
            for i, source in enumerate(sources):
                t0 = time.monotonic()
                correct += sandbox.judge_source("rmsnorm", source, f"variant-{i}.py").correct
                each.append(time.monotonic() - t0)
                print(f"  local {i + 1}/{len(sources)} ({each[-1]:.1f} s)", file=sys.stderr, flush=True)
        end = time.monotonic()
    return {"seconds": end - start, "warm_s": end - warm_at, "median_s": _median(each), "correct": correct + warm,
            "judged": len(sources) + 1, "load": (load + os.getloadavg()[0]) / 2, "cpu": span}


def judge_pool(address: str, workers: int, sources: list[str], warmups: list[str],
               options: CheckOptions) -> dict[str, Any]:
    """The warm-up jobs (one per actor: each builds its Sandbox on its first job) are judged first, then
    the stream; `warm_s` is the stream's own wall time."""
    jobs = [ClusterJob("rmsnorm", s, f"variant-{i}.py", options) for i, s in enumerate(sources)]
    with JudgePool(address, device=options.device, workers=workers) as pool:
        arrivals: list[float] = []

        def arrived(i: int, v: object) -> None:
            arrivals.append(time.monotonic())
            print(f"  {workers} actor(s) {len(arrivals)}/{len(jobs)}", file=sys.stderr, flush=True)

        load = os.getloadavg()[0]
        start = time.monotonic()
        warm = pool.judge([ClusterJob("rmsnorm", s, f"warm-up-{i}.py", options)
                           for i, s in enumerate(warmups[:workers])])
        warm_at = time.monotonic()
        with CpuSpan() as span:
            verdicts = pool.judge(jobs, on_verdict=arrived)
        end = time.monotonic()
    gaps = [b - a for a, b in zip([warm_at] + arrivals, arrivals)]
    return {"seconds": end - start, "warm_s": end - warm_at, "median_s": _median(gaps),
            "correct": sum(v.correct for v in verdicts + warm), "judged": len(jobs) + len(warm),
            "load": (load + os.getloadavg()[0]) / 2, "cpu": span}


def _ray_own(span: CpuSpan) -> float:
    shares = span.shares()
    return shares.get("ray daemons", 0.0) + shares.get("ray idle workers", 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--timing", action="store_true", help="judge with A/B timing too (slower)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rehearse", action="store_true", help="1 candidate after the warm-ups, on the CPU: the code path only")
    parser.add_argument("--out-dir", type=Path, default=None, help="report folder (default docs/benchmarks)")
    args = parser.parse_args(argv)
    device = CPU if args.rehearse else DEVICES[args.device]
    try:
        ray = import_ray()
    except ClusterUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    gpus = 0
    if not device.interpreted:
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 1:
            print(f"skipped: --device {device} and no GPU here")
            return 0
    pools = (1, 2) if device.interpreted else sorted({1, gpus})  # on cuda: one actor per GPU
    streamed = 1 if args.rehearse else args.candidates
    sources = candidate_stream(streamed + pools[-1])  # then a warm-up candidate per actor of the largest pool
    sources, warmups = sources[:streamed], sources[streamed:]
    options = CheckOptions(device=device, registry=Path("/nonexistent-kernelloop-registry"), timing=args.timing,
                           dtypes=("float32",), seed=1, batch_invariance=False, timeout_s=600)
    results = {"local judge": judge_local(sources, warmups, options)}
    temp = Path(tempfile.mkdtemp(prefix="klray-", dir="/tmp"))  # Ray's socket paths must stay short
    try:
        keep_loopback()
        ray.init(num_cpus=2 if device.interpreted else max(2, gpus), include_dashboard=False,
                 _node_ip_address="127.0.0.1", _temp_dir=str(temp), log_to_driver=False, configure_logging=False)
        address = ray.get_runtime_context().gcs_address
        for workers in pools:
            results[f"{workers} actor{'s' * (workers > 1)}"] = judge_pool(address, workers, sources, warmups, options)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    for name, r in results.items():
        if r["correct"] != r["judged"]:
            print(f"error: {r['judged'] - r['correct']} honest candidates judged incorrect ({name})", file=sys.stderr)
            return 1
    cold = {name: r["judged"] / r["seconds"] * 60 for name, r in results.items()}
    rate = {name: len(sources) / r["warm_s"] * 60 for name, r in results.items()}
    rows = [{"judge": name, "candidates": f"{r['judged'] - len(sources)} + {len(sources)}",
             "wall (s)": f"{r['seconds']:.1f}", "cand/min from start": f"{cold[name]:.1f}",
             "cand/min warm": f"{rate[name]:.1f}", "steady s between verdicts": f"{r['median_s']:.2f}",
             "load avg (1 min)": f"{r['load']:.1f}", "busy cores": f"{r['cpu'].cores():.2f}",
             "Ray's own cores": f"{_ray_own(r['cpu']):.2f}", "driver cores": f"{r['cpu'].shares().get('driver', 0):.2f}"}
            for name, r in results.items()]
    most = f"{pools[-1]} actor{'s' * (pools[-1] > 1)}"
    ratio, cold_ratio = rate[most] / rate["1 actor"], cold[most] / cold["1 actor"]
    ceiling = 2 / results["1 actor"]["cpu"].cores()
    overhead = results["1 actor"]["median_s"] / results["local judge"]["median_s"] - 1
    print_table(rows)
    battery = "correctness + A/B timing" if args.timing else "correctness only (no A/B timing)"
    notes = [
        f"Battery: rmsnorm, float32 only, {battery}, batch invariance probe off, confined as usual; the same "
        f"options and the same {len(sources)} distinct honest candidates (bench.sandbox_throughput's stream) "
        "for every judge.",
        "Cluster: a one-node Ray cluster started by the benchmark on 127.0.0.1 (num_cpus=2, dashboard off); "
        "each actor (num_cpus=1) builds its Sandbox, fork server included, on its first job, as the local "
        "judge does. Each judge first judges one warm-up candidate per actor (the `candidates` column: warm-up "
        "+ stream): `cand/min from start` counts both over the whole wall time (the Sandboxes' start included, "
        "not the actors' own), `cand/min warm` the stream alone, as a long-running daemon's judges run.",
        f"{most} / 1 actor, warm: **{ratio:.2f}x**; from start: {cold_ratio:.2f}x"
        + (f" (target on 2 idle cores: >= {TARGET_RATIO}x)." if device.interpreted else "."),
        f"Cluster overhead per candidate: **{overhead * 100:+.1f}%** of a local check (1 actor's steady "
        f"seconds per candidate vs the local judge's; target <= {TARGET_OVERHEAD * 100:.0f}%).",
        "`busy cores` (over the warm stream): the machine's busy CPU time over the stream's wall time "
        "(/proc/stat: every process, the sandboxed ones included); `Ray's own cores`: what Ray's daemons (GCS, "
        "raylet, agents) and idle workers used of it; `driver cores`: this process (the local judge itself; "
        "for a pool, the head's JudgePool). One judge keeps more than a core busy (its runner and replayer "
        f"overlap), so on 2 cores 2 actors can be at most 2 / {results['1 actor']['cpu'].cores():.2f} = "
        f"**{ceiling:.2f}x** one actor.",
        "The `load avg` column: the 1-minute load average, mean of its value before and after each stream "
        "(about 2 is this benchmark alone on 2 cores)."
        + (" Other work shared the machine during this run: the ratio and the overhead are noisy, not the "
           "idle-machine figures the targets name." if max(r["load"] for r in results.values()) > 2.6 else ""),
    ]
    path = write_report("cluster-throughput", "Cluster judge throughput: local judge vs 1 and 2 Ray actors",
                        rows, device=device.torch, notes=notes, out_dir=args.out_dir,
                        interpreter_timings=device.interpreted)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
