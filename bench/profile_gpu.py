"""The engine's op table on a GPU: `python -m bench.profile_gpu [--kernels baseline] [--out-dir DIR]`.

A Llama-3-8B-shaped model with seeded random bf16 weights (no download) serves the built-in
agent-shaped workload in-process with the recorder on; the table is the profile's rows (share of
step time, mean time per call, achieved GB/s and percent of the copy bandwidth measured in the
same run) plus ncu metrics for the costliest op where ncu is available.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

import kernels  # noqa: F401  (configures Triton)
from bench.engine_gpu import LLAMA3_8B, write_model_dir
from bench.report import print_table, write_report
from engine.engine import Engine, EngineConfig
from engine.scheduler import SchedulerConfig
from profiler.inprocess import profile_engine
from profiler.ncu import ncu_metrics
from profiler.workload import agent_workload

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", choices=("reference", "baseline", "registry"), default="baseline")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_gpu: no CUDA device", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp), LLAMA3_8B)
        (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
        engine = Engine(EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", kernels=args.kernels,
                                     random_weights=True, scheduler=SchedulerConfig(max_running_requests=args.concurrency)))
        profile_engine(engine, agent_workload(4, seed=1), concurrency=4)  # warm-up: Triton compiles, allocator grows
        profile = profile_engine(engine, agent_workload(args.requests, seed=0), concurrency=args.concurrency,
                                 seconds=args.seconds)
    rows = [{"row": r["name"], "calls": r["calls"], "share %": f"{100 * r['share']:.1f}",
             "mean us": f"{r['mean_us']:.1f}", "GB/s": f"{r['bytes_per_s'] / 1e9:.0f}" if r["bytes_per_s"] else "-",
             "% roofline": f"{r['roofline_pct']:.1f}" if r["roofline_pct"] is not None else "-",
             "variant": r["variant"] or "-",
             "top bucket": f"{r['shapes'][0]['dtype']} {r['shapes'][0]['bucket']}" if r["shapes"] else "-"}
            for r in profile["rows"]]
    print_table(rows)
    top = next((r["name"] for r in profile["rows"] if r["kind"] == "op"), None)
    ncu = ncu_metrics(top, timeout_s=40) if top else {"available": False, "reason": "no op ran", "metrics": {}}
    notes = [
        f"Llama-3-8B shape, random bf16 weights, kernels={args.kernels}, in-process, agent-shaped workload: "
        f"{profile['requests']} requests at concurrency {args.concurrency}; {profile['output_tokens']} output tokens in "
        f"{profile['wall_seconds']:.1f} s = {profile['tokens_per_second']:.0f} tokens/s; TTFT median "
        f"{profile['ttft_ms_median']:.1f} ms, TPOT median {profile['tpot_ms_median']:.1f} ms; prefix-cache hit rate "
        f"{100 * (profile['prefix_hit_rate'] or 0):.0f}%.",
        "Shares are of engine step time; rows outside the op library (matmul, prefill attention, sampling, "
        "scheduling, Python) make them add up to 100%. Profiling runs eagerly (no CUDA graphs), with a CUDA-event "
        "pair around every op call and step region.",
        "ncu " + (f"{ncu['op']}: " + ", ".join(f"{k} = {v:.4g}" for k, v in ncu["metrics"].items())
                  if ncu.get("available") else f"skipped: {ncu.get('reason')}"),
    ]
    path = write_report("engine-profile", "Engine op profile (Llama-3-8B shape, bf16)", rows, device="cuda",
                        notes=notes, out_dir=args.out_dir)
    print(f"wrote {path}")
    return 0 if profile["rows"] and not profile["partial"] else 1


if __name__ == "__main__":
    sys.exit(main())
