"""The engine's op table on a GPU: `python -m bench.profile_gpu [--kernels baseline] [--out-dir DIR] [--rehearse]`.

A Llama-3-8B-shaped model with seeded random bf16 weights (no download) serves the built-in
agent-shaped workload in-process with the recorder on; the table is the profile's rows (share of
step time, mean time per call, achieved GB/s and percent of the copy bandwidth measured in the
same run) plus ncu metrics for the costliest op where ncu is available.

Op times are device (kernel) times: after the run every observed (op, dtype, shape bucket) is
replayed in isolation on the variant that served it (engine/recorder.py); each row's `timing` says
so, next to its in-run CUDA-event time (which, with eager decode bound by the host, is mostly launch
gaps). The report is written once the profile is in (PARTIAL while ncu runs), again with ncu's
figures. Exit 1 when the profile is partial or empty, an op was not timed by the replay, or a
Triton kernel fell back to its reference.

`--rehearse` runs the same path on CPU (Triton's interpreter) with bench/rehearse.py's tiny model
and a few short requests; its numbers time the interpreter, nothing else.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.recorder import replay_timing
from kernelloop.engine.scheduler import SchedulerConfig
from kernelloop.kernels.device import Device
from kernelloop.profiler.inprocess import profile_engine
from kernelloop.profiler.ncu import availability as ncu_availability
from kernelloop.profiler.ncu import ncu_metrics
from kernelloop.profiler.workload import WorkloadRequest, agent_workload

from bench.engine_gpu import LLAMA3_8B
from bench.rehearse import CHAT_TEMPLATE, TINY_LLAMA, step_device, write_chat_model_dir
from bench.report import print_table, write_report

__all__ = ["CHAT_TEMPLATE", "main"]  # CHAT_TEMPLATE: re-exported for bench.tune_gpu (bench.rehearse owns it)
STEP = "bench.profile_gpu"
# requests, concurrency, seconds cap, warm-up requests, (min, max) new tokens per request
GPU_RUN = {"requests": 48, "concurrency": 16, "seconds": 20.0, "warmup": 4, "max_tokens": (4, 24)}
REHEARSAL = {"requests": 3, "concurrency": 2, "seconds": 30.0, "warmup": 1, "max_tokens": (2, 4), "chars": 10}
NCU_TIMEOUT_S = 40.0
NCU_MIN_S = 10.0  # ncu is not started with less than this left of the budget


def workload(requests: int, seed: int, plan: dict[str, Any]) -> list[WorkloadRequest]:
    """The agent-shaped workload; the rehearsal cuts every message to a few characters (the interpreter
    takes seconds per op call on a 200-token prefill), keeping the shared prefixes and the turns."""
    reqs = agent_workload(requests, seed=seed, max_tokens=plan["max_tokens"])
    chars = plan.get("chars")
    if not chars:
        return reqs
    return [WorkloadRequest([{**m, "content": m["content"][:chars]} for m in w.messages], w.max_tokens) for w in reqs]


def table(profile: dict[str, Any]) -> list[dict[str, Any]]:
    def in_run_us(r: dict[str, Any]) -> str:
        return f"{1e6 * r['in_run_s'] / r['calls']:.1f}" if r.get("in_run_s") is not None and r["calls"] else "-"

    return [{"row": r["name"], "calls": r["calls"], "share %": f"{100 * r['share']:.1f}",
             "mean us": f"{r['mean_us']:.1f}", "in-run us": in_run_us(r),
             "timing": r.get("timing") or "-",
             "GB/s": f"{r['bytes_per_s'] / 1e9:.0f}" if r["bytes_per_s"] else "-",
             "% roofline": f"{r['roofline_pct']:.1f}" if r["roofline_pct"] is not None else "-",
             "variant": r["variant"] or "-",
             "top bucket": f"{r['shapes'][0]['dtype']} {r['shapes'][0]['bucket']}" if r["shapes"] else "-"}
            for r in profile["rows"]]


def problems(profile: dict[str, Any], device: Device, kernels_mode: str) -> list[str]:
    """What makes this step fail: no profile, a partial one, ops not timed by the replay, a fallback."""
    out = []
    if not profile["rows"]:
        out.append("the profile has no rows")
    if profile["partial"]:
        out.append(f"the profile is partial: {profile['partial_reason']}")
    expected = replay_timing(device)
    ops = [r for r in profile["rows"] if r["kind"] == "op"]
    if not ops:
        out.append("no op of the library ran")
    untimed = [f"{r['name']} ({r.get('timing')})" for r in ops if r.get("timing") != expected]
    if untimed:
        out.append(f"op rows not timed by the {expected} replay: {', '.join(untimed)}; "
                   f"replay errors: {'; '.join(profile.get('replay_errors') or []) or 'none'}")
    fallen = [r["name"] for r in ops if kernels_mode != "reference" and "reference" in (r["variant"] or "")]
    if fallen:
        out.append(f"a Triton kernel failed and fell back to the reference: {', '.join(fallen)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", choices=("reference", "baseline", "registry"), default="baseline")
    parser.add_argument("--requests", type=int, default=None, help=f"default {GPU_RUN['requests']} "
                        f"(rehearsal {REHEARSAL['requests']})")
    parser.add_argument("--concurrency", type=int, default=None, help=f"default {GPU_RUN['concurrency']} "
                        f"(rehearsal {REHEARSAL['concurrency']})")
    parser.add_argument("--seconds", type=float, default=None, help=f"cap on the profiled run (default "
                        f"{GPU_RUN['seconds']:g}; rehearsal {REHEARSAL['seconds']:g})")
    parser.add_argument("--budget-s", type=float, default=55.0,
                        help="the whole step's time; ncu gets what is left, at most 40 s (default 55)")
    parser.add_argument("--rehearse", action="store_true",
                        help="this step's path on CPU (TRITON_INTERPRET=1) with a tiny model and a few requests")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = step_device(args.rehearse, STEP)
    if device is None:
        return 2
    plan = REHEARSAL if args.rehearse else GPU_RUN
    requests = args.requests or plan["requests"]
    concurrency = args.concurrency or plan["concurrency"]
    seconds = args.seconds or plan["seconds"]
    config, shape_name = (TINY_LLAMA, "tiny Llama (rehearsal)") if args.rehearse else (LLAMA3_8B, "Llama-3-8B shape")

    def log(message: str) -> None:
        print(f"[profile_gpu {time.perf_counter() - start:.0f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_chat_model_dir(Path(tmp), config)
        engine = Engine(EngineConfig(model=str(model_dir), device=device, dtype="bfloat16", kernels=args.kernels,
                                     random_weights=True, kv_cache_bytes=(64 << 20) if args.rehearse else None,
                                     scheduler=SchedulerConfig(max_running_requests=concurrency)))
        log(f"engine up ({shape_name}, {device}); warm-up")
        profile_engine(engine, workload(plan["warmup"], 1, plan),
                       concurrency=concurrency, op_timing="in-run")  # Triton compiles, allocator grows
        log(f"profiling {requests} requests at concurrency {concurrency} (at most {seconds:g} s)")
        profile = profile_engine(engine, workload(requests, 0, plan),
                                 concurrency=concurrency, seconds=seconds, op_timing="replay")
        log(f"profile in: {profile['requests']} requests, op timing {profile['op_timing']}")
        del engine
    rows = table(profile)
    print_table(rows)
    found = problems(profile, device, args.kernels)
    notes = [
        f"{shape_name}, random bf16 weights, kernels={args.kernels}, in-process, agent-shaped workload: "
        f"{profile['requests']} requests at concurrency {concurrency}; {profile['output_tokens']} output tokens in "
        f"{profile['wall_seconds']:.1f} s = {profile['tokens_per_second']:.0f} tokens/s; TTFT median "
        f"{profile['ttft_ms_median'] or 0:.1f} ms, TPOT median {profile['tpot_ms_median'] or 0:.1f} ms; prefix-cache "
        f"hit rate {100 * (profile['prefix_hit_rate'] or 0):.0f}%.",
        f"Op rows: {profile['op_timing']} (timing column). After the run each observed (op, dtype, bucket) is replayed "
        "in isolation on the variant that served it, at up to 3 of its shapes (kernels.timing.time_calls: an L2 "
        "flush ahead of each call, device time on CUDA), and every shape seen is priced by interpolating in bytes "
        "moved; in-run us is the mean in-run bracket per call (a CUDA-event pair on GPU: with eager decode bound by "
        "the host it is mostly launch gap).",
        f"Shares are of engine step time (regions: {profile['region_timing']}); every projection (linear) and both "
        "attentions are op rows; rows outside the op library (other model compute, sampling, scheduling, Python) "
        "make them add up to 100%; the host's launch gaps between op kernels land in 'other model compute'. "
        "Profiling runs eagerly (no CUDA graphs).",
    ]
    notes += [f"replay: {e}" for e in profile.get("replay_errors") or []]
    notes += [f"problem: {p}" for p in found]

    def write(ncu_note: str, status: str = "") -> Path:
        return write_report("engine-profile", f"Engine op profile ({shape_name}, bf16)", rows, device=device.torch,
                            notes=([status] if status else []) + notes + [ncu_note], out_dir=args.out_dir)

    path = write("ncu: pending", "PARTIAL: written before ncu ran")
    log(f"wrote {path}; ncu next")
    top = next((r["name"] for r in profile["rows"] if r["kind"] == "op"), None)
    left = args.budget_s - (time.perf_counter() - start)
    unavailable = ncu_availability()  # cheap: says why ncu cannot run before any time is spent on it
    if top is None:
        ncu = {"available": False, "reason": "no op ran", "metrics": {}}
    elif unavailable:
        ncu = {"available": False, "reason": unavailable, "metrics": {}}
    elif left < NCU_MIN_S:
        reason = f"only {max(left, 0):.0f} s of the {args.budget_s:g} s budget left"
        ncu = {"available": False, "reason": reason, "metrics": {}}
    else:
        ncu = ncu_metrics(top, timeout_s=min(NCU_TIMEOUT_S, left))
    if ncu.get("available"):
        ncu_note = f"ncu {ncu['op']}: " + ", ".join(f"{k} = {v:.4g}" for k, v in ncu["metrics"].items())
    else:
        ncu_note = f"ncu skipped: {ncu.get('reason')}"
    print(ncu_note)
    path = write(ncu_note)
    print(f"wrote {path}")
    for p in found:
        print(f"{STEP}: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
