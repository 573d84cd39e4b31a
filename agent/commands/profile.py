"""`agent profile`: where the engine's time goes, per op (with shapes and roofline) and for the rest.

With `--engine URL` it profiles a running engine over HTTP while driving the built-in agent-shaped
workload through it; without, it starts an engine in this process on the embedded model. The
profile is printed (a table, or JSON with --json) and recorded in the history database.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernelloop.agent.commands.common_args import add_device_argument, add_history_argument
from kernelloop.agent.render import print_json, print_table
from kernelloop.common.errors import KernelloopError
from kernelloop.common.progress import Progress
from kernelloop.profiler.workload import agent_workload


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profile the engine: time per op, shapes, roofline, tokens/s, TTFT, TPOT")
    p.add_argument("--engine", default=None, metavar="URL", help="a running engine (default: start one in-process)")
    p.add_argument("--seconds", type=float, default=120.0,
                   help="time limit of the workload (default 120); with --engine, extended while no token has "
                        "come back, then requests still running are cancelled")
    p.add_argument("--requests", type=int, default=16, help="requests in the built-in workload (default 16)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="in-process only: model directory or a known name (smollm2) (default: the embedded model)")
    p.add_argument("--kernels", choices=("reference", "baseline", "registry"), default="reference",
                   help="in-process only: which kernels the engine runs (default reference: fast on CPU)")
    add_device_argument(p, "in-process only: where the engine runs")
    p.add_argument("--trace", type=Path, default=None, metavar="FILE",
                   help="in-process only: write a Chrome trace (opens in Perfetto)")
    p.add_argument("--ncu", default=None, metavar="OP",
                   help="also collect Nsight Compute metrics for OP's kernel (GPU with ncu; a one-line skip otherwise)")
    add_history_argument(p, "history database the profile is recorded in")
    p.add_argument("--no-history", action="store_true", help="do not record the profile")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.concurrency < 1 or args.seconds <= 0:
        raise KernelloopError("--requests, --concurrency and --seconds must be positive")
    workload = agent_workload(args.requests, seed=args.seed)
    if args.engine and args.trace is not None:
        raise KernelloopError("--trace needs an in-process engine (drop --engine)")
    from kernelloop.agent.progress_view import ProgressView

    with ProgressView() as progress:  # a bar on a terminal (stderr), one line per message otherwise
        if args.engine:
            from kernelloop.profiler.http import profile_url

            profile = profile_url(args.engine, workload, concurrency=args.concurrency, seconds=args.seconds,
                                  progress=progress)
        else:
            profile = _profile_in_process(args, workload, progress)
    if args.ncu:
        from kernelloop.kernels import get_op
        from kernelloop.profiler.ncu import ncu_metrics

        get_op(args.ncu)  # an unknown op is a usage error
        profile["ncu"] = ncu_metrics(args.ncu)
    if not args.no_history:
        profile["history_id"] = _record(args.history, profile)
    if args.json:
        print_json(profile)
    else:
        show(profile)
    return 0


def _profile_in_process(args: argparse.Namespace, workload: list, progress: Progress) -> dict[str, Any]:
    from kernelloop.agent.local_engine import LocalEngine
    from kernelloop.kernels.device import resolve_device

    engine = LocalEngine(model=args.model, device=resolve_device(args.device), kernels=args.kernels,
                         name="an in-process engine", progress=progress)
    try:
        return engine.profile(workload, progress, concurrency=args.concurrency, seconds=args.seconds,
                              trace_path=args.trace)
    finally:
        engine.close()


def _record(path: Path | None, profile: dict[str, Any]) -> int:
    from kernelloop.history import History

    with History(path) as history:
        return history.record_profile(profile)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def show(profile: dict[str, Any]) -> None:
    rows = [(r["name"], r["calls"], _fmt(r["total_s"] * 1e3, ".1f"), _fmt(r["mean_us"], ".1f"),
             f"{100 * r['share']:.1f}%", r["variant"] or "-", _fmt(r["roofline_pct"], ".2f"),
             "; ".join(f"{s['dtype']} {s['bucket']} x{s['calls']}" for s in r["shapes"][:2]) or "-")
            for r in profile["rows"]]
    title = (f"profile of {profile['engine']} on {profile['device']} (kernels={profile['kernels']})"
             + (f" — PARTIAL: {profile['partial_reason']}" if profile["partial"] else ""))
    print_table(title, ("row", "calls", "total ms", "mean us", "share", "variant", "% roofline", "top shapes"), rows)
    print(f"{profile['requests']} requests, {profile['output_tokens']} output tokens in {profile['wall_seconds']:.1f} s: "
          f"{profile['tokens_per_second']:.1f} tokens/s; TTFT median {_fmt(profile.get('ttft_ms_median'), '.1f')} ms, "
          f"TPOT median {_fmt(profile.get('tpot_ms_median'), '.1f')} ms; prefix-cache hit rate "
          f"{_fmt(None if profile['prefix_hit_rate'] is None else 100 * profile['prefix_hit_rate'], '.0f')}%")
    for note in profile.get("notes") or []:
        print(f"note: {note}")
    if "ncu" in profile:
        n = profile["ncu"]
        print(f"ncu {n['op']}: " + (", ".join(f"{k} {v:.4g}" for k, v in n["metrics"].items()) if n["available"]
                                    else f"skipped: {n['reason']}"))
    if profile["timing_label"] == "cpu-interpreter":
        print("CPU timings (device cpu-interpreter): `reference` ops are torch on the CPU, `baseline` and registry "
              "kernels run in Triton's interpreter; none of it says anything about a GPU")
