"""`agent quantize`: choose which projections to store in int8/int4/fp8 under a KL budget, and commit them.

Calibration prompts from the profiler's agent workload; every projection's sensitivity per scheme (the KL of the
final distribution when only it is quantized); a greedy selection on bytes saved per nat, measured as a whole and
repaired on validation prompts, not the calibration ones it was chosen on (agent/quantize/); the held-out quality and the alternatives; then each used scheme's baseline kernel
judged in the sandbox, the selection committed as scoped registry entries in one commit, gated in budget mode
and rolled back if the gate fails (agent/quantize/apply.py). Exit 0: committed (or --dry-run); 1: the gate
failed and the commit was rolled back, a baseline kernel was not correct, or nothing fits the budget; 2: usage.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from kernelloop.agent.commands.common_args import (
    add_device_argument,
    add_history_argument,
    add_registry_argument,
    positive_int,
)
from kernelloop.agent.render import print_json, print_table
from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import Device

DEFAULT_BUDGET = 0.05
INTERPRETED_GATE_HELD_OUT = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="quantize the projections that cost least KL per byte saved, under a budget")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="model directory or a known name (smollm2) (default: the embedded model)")
    add_device_argument(p, "where the model is measured, the kernels judged and the gate run")
    p.add_argument("--schemes", default=None, metavar="LIST",
                   help="comma-separated weight schemes to choose from (default int8,int4, plus fp8 where the device "
                        "computes it: CUDA capability 8.9+)")
    p.add_argument("--kl-budget", type=float, default=DEFAULT_BUDGET, metavar="NATS",
                   help=f"mean KL per token to the unquantized model the selection may cost (default {DEFAULT_BUDGET}: "
                        "small enough that greedy decoding mostly keeps its tokens, large enough for most projections "
                        "to fit in int8)")
    p.add_argument("--knee", type=float, default=None, metavar="F",
                   help="stop climbing at the first rung costing over F times the nats per byte of the selection so "
                        "far (default 30: no doubling the KL for under 1/30 more bytes); 0 fills the budget")
    p.add_argument("--calibration", type=positive_int, default=8, metavar="N", help="calibration prompts (default 8)")
    p.add_argument("--validation", type=positive_int, default=8, metavar="N",
                   help="prompts the whole selection is measured and repaired on, disjoint from calibration: its KL "
                        "is not flattered by the prompts each projection was chosen on (default 8)")
    p.add_argument("--held-out", type=positive_int, default=8, metavar="N",
                   help="held-out prompts the selection is evaluated on, disjoint from the others (default 8)")
    p.add_argument("--gate-held-out", type=positive_int, default=None, metavar="N",
                   help="held-out prompts the gate also teacher-forces through the served kernels (default: all of "
                        f"them on a GPU, {INTERPRETED_GATE_HELD_OUT} on the CPU interpreter, where each takes minutes)")
    p.add_argument("--tokens", type=positive_int, default=16, metavar="T",
                   help="greedy continuation tokens per prompt that KL is measured along (default 16)")
    p.add_argument("--dry-run", action="store_true", help="measure and select; judge and commit nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    add_registry_argument(p)
    add_history_argument(p)
    p.set_defaults(run=run)


def parse_schemes(text: str | None, device: Device) -> list[Any]:
    """The schemes asked for (default int8,int4 and fp8 where supported); an unknown or unsupported one is a
    usage error."""
    from kernelloop.kernels.quant import SCHEMES, QuantizationError, scheme

    if text is None:
        return [SCHEMES["int8"], SCHEMES["int4"]] + ([SCHEMES["fp8"]] if SCHEMES["fp8"].supported(device) else [])
    out = []
    for name in dict.fromkeys(n.strip() for n in text.split(",") if n.strip()):
        try:
            s = scheme(name)
        except QuantizationError as exc:
            raise KernelloopError(f"--schemes: {exc}") from None
        if not s.supported(device):
            raise KernelloopError(f"--schemes: {name} is not supported on {device} (needs CUDA capability 8.9+)")
        out.append(s)
    if not out:
        raise KernelloopError("--schemes: name at least one of int8, int4, fp8")
    return out


def run(args: argparse.Namespace) -> int:
    from kernelloop.kernels.device import resolve_device

    if not math.isfinite(args.kl_budget) or args.kl_budget <= 0:
        raise KernelloopError("--kl-budget must be a positive number of nats")
    if args.knee is not None and (not math.isfinite(args.knee) or args.knee < 0):
        raise KernelloopError("--knee must be 0 (fill the budget) or a positive factor")
    device = resolve_device(args.device)
    schemes = parse_schemes(args.schemes, device)
    from kernelloop.agent.progress_view import ProgressView
    from kernelloop.history import History

    with History(args.history) as history, ProgressView() as progress:
        if not args.dry_run:
            from kernelloop.agent.quantize.apply import roll_back_unfinished
            from kernelloop.kernels.registry import Registry

            roll_back_unfinished(Registry(args.registry), history, progress)
        report = quantize(args, device, schemes, history, progress)
    show(report, args.json)
    return 0 if report["status"] in ("committed", "dry-run") else 1


def quantize(args: argparse.Namespace, device: Device, schemes: list[Any], history: Any, progress: Any) -> dict[str, Any]:
    """Measure, select, evaluate; then (unless --dry-run) judge, commit, gate and roll back on failure. Returns the
    run's record (what --json prints and the history's "quantize" event holds)."""
    from kernelloop.agent.local_engine import LocalEngine
    from kernelloop.agent.quantize.alternatives import alternatives
    from kernelloop.agent.quantize.apply import CALIBRATION_SEED, HELD_OUT_SEED, VALIDATION_SEED, workload_prompts
    from kernelloop.agent.quantize.measure import calibrate, quality, sensitivities
    from kernelloop.agent.quantize.selection import KNEE_FACTOR, select
    from kernelloop.kernels.device import device_fingerprint
    from kernelloop.kernels.spec import dtype_name

    budget = args.kl_budget
    engine = LocalEngine(model=args.model, device=device, kernels="reference", name="the measured engine",
                         progress=progress)
    try:
        calib_prompts = workload_prompts(engine, args.calibration, CALIBRATION_SEED)
        held_prompts = workload_prompts(engine, args.held_out, HELD_OUT_SEED, avoid=calib_prompts)
        val_prompts = workload_prompts(engine, args.validation, VALIDATION_SEED, avoid=calib_prompts + held_prompts)
        progress(f"calibrating: {len(calib_prompts)} prompts, {args.tokens} tokens each (validation: "
                 f"{len(val_prompts)}, held out: {len(held_prompts)})")
        calibration = calibrate(engine, calib_prompts, args.tokens)
        validation = calibrate(engine, val_prompts, args.tokens)
        held_out = calibrate(engine, held_prompts, args.tokens)
        sens = sensitivities(engine, calibration, schemes, progress)
        knee = KNEE_FACTOR if getattr(args, "knee", None) is None else args.knee
        selection = select(sens, budget, lambda plan: quality(engine, validation, plan), progress, knee=knee)
        on_calibration = quality(engine, calibration, selection.plan)
        held = quality(engine, held_out, selection.plan)
        progress("alternatives: quantize all, keep first and last, random at the same bytes (held-out prompts)")
        alts = alternatives(engine, held_out, sens, selection, schemes)
        shapes = engine.projections()
        total = sum(n * k for n, k in shapes.values()) * engine.weight_itemsize
        dtype = dtype_name(engine.engine.model.dtype)
    finally:
        engine.close()
    report: dict[str, Any] = {
        "model": args.model or "embedded", "device": device_fingerprint(device), "dtype": dtype, "budget": budget,
        "schemes": [s.name for s in schemes], "tokens": args.tokens,
        "sensitivities": [s.to_json() for s in sens], "selection": selection.to_json(),
        "calibration": {"prompts": len(calib_prompts), **on_calibration.to_json()},
        "validation": {"prompts": len(val_prompts), **selection.measured.to_json()},
        "held_out": {"prompts": len(held_prompts), **held.to_json()}, "alternatives": alts,
        "bytes": {"projections": total, "saved": selection.bytes_saved}, "commit": None, "gate": None}
    if not selection.chosen:
        report.update(status="no-selection", reason=f"no projection fits a KL budget of {budget:g} nats")
    elif args.dry_run:
        report.update(status="dry-run", reason="--dry-run: nothing judged or committed")
    else:
        commit_and_gate(args, device, schemes, report, selection.plan, history, progress, held_out)
    if report["commit"] is None:  # a committed run recorded itself before its gate
        record(history, report)
    return report


def record(history: Any, report: dict[str, Any]) -> None:
    """The run's "quantize" registry event (the gate's and a rollback's follow it, naming the same commit)."""
    history.record_registry_event("quantize", None, commit_sha=report["commit"], device=report["device"],
                                  dtype=report["dtype"], ok=report["commit"] is not None,
                                  detail={k: v for k, v in report.items() if k != "gate"})


def commit_and_gate(args: argparse.Namespace, device: Device, schemes: list[Any], report: dict[str, Any],
                    plan: dict[str, str], history: Any, progress: Any, held_out: Any = None) -> None:
    """Judge the used schemes' baselines, commit the selection, gate it (its KL on the gate prompts and on the
    `held_out` measure.Calibration); roll back when the gate fails. Fills report's status, reason, commit and gate."""
    from kernelloop.agent.loop.context import LoopContext
    from kernelloop.agent.quantize.apply import (
        commit_selection,
        gate_commit,
        gate_summary,
        judge_baselines,
        light_gate,
        record_rollback,
    )
    from kernelloop.kernels.registry import Registry

    used = [s for s in schemes if s.name in set(plan.values())]
    judged = judge_baselines(used, device, str(args.registry) if args.registry else None, progress)
    wrong = [j for j in judged.values() if not j.verdict.correct]
    if wrong:
        j = wrong[0]
        report.update(status="kernel-incorrect", reason=f"{j.scheme.op}'s baseline kernel is not correct on {device}: "
                                                        f"{j.verdict.reason}")
        return
    if held_out is not None:
        limit = getattr(args, "gate_held_out", None) or (INTERPRETED_GATE_HELD_OUT if device.interpreted else None)
        held_out = held_out.first(limit)
        report["gate_held_out_prompts"] = len(held_out.pairs)
    registry = Registry(args.registry)
    ctx = LoopContext(history=history, registry=registry, proposers={}, device=device, model=args.model,
                      gate=light_gate(report["budget"], device), progress=progress)
    try:
        before = gate_summary(ctx, held_out)
        sha = commit_selection(registry, plan, judged, report["device"], report["dtype"], report["budget"])
        report.update(commit=sha, status="gating", reason="")
        record(history, report)
        progress(f"committed {len(plan)} scoped entries ({sha[:10]}); gating in budget mode")
        try:
            result, speed = gate_commit(ctx, before, sha, interpreted=device.interpreted, held_out=held_out)
        except BaseException as exc:  # an unfinished gate never leaves its commit serving
            why = f"the gate did not finish: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            registry.rollback(sha)
            record_rollback(history, sha, report["device"], report["dtype"], why)
            report.update(status="rolled-back", reason=f"rolled back: {why}")
            if not isinstance(exc, Exception):
                raise
            return
        report["gate"] = result.to_json()
        history.record_registry_event("gate", None, commit_sha=sha, device=report["device"], dtype=report["dtype"],
                                      ok=result.ok, detail={**result.to_json(), "speed": speed, "engine": "in-process",
                                                            "quantize": True})
        progress(f"end-to-end gate: {'passed' if result.ok else 'FAILED'}: {result.reason}")
        if result.ok:
            report.update(status="committed", reason=result.reason)
            return
        registry.rollback(sha)
        record_rollback(history, sha, report["device"], report["dtype"], result.reason)
        ctx.reload()
        report.update(status="rolled-back", reason=f"rolled back: {result.reason}")
    finally:
        ctx.close()


def show(report: dict[str, Any], as_json: bool) -> None:
    chosen = report["selection"]["chosen"]
    rows = [(s["scope"], s["scheme"], f"{s['kl']:.2e}", f"{s['saved'] / 2**20:.2f}") for s in chosen]
    print_table(f"agent quantize: {len(chosen)} projections chosen under {report['budget']:g} nats on {report['device']}",
                ("scope", "scheme", "solo KL (nats)", "MiB saved"), rows)
    b, cal, val, held = report["bytes"], report["calibration"], report["validation"], report["held_out"]
    share = b["saved"] / b["projections"] if b["projections"] else 0.0
    print(f"bytes saved: {b['saved'] / 2**20:.2f} MiB of {b['projections'] / 2**20:.2f} MiB of projection weights "
          f"({share:.1%})")
    print(f"KL: calibration {cal['kl']:.2e} nats (agreement {cal['agreement']:.1%}), validation {val['kl']:.2e} "
          f"(upper bound {val['kl_upper']:.2e}, agreement {val['agreement']:.1%}), held-out {held['kl']:.2e} nats "
          f"(agreement {held['agreement']:.1%})")
    knee = report["selection"].get("knee") or {}
    if knee.get("left_rungs"):
        print(f"knee: stopped before {knee['stopped_before']}; filling the budget (--knee 0) would add "
              f"{knee['left_rungs']} rungs, {knee['left_bytes'] / 2**20:.2f} MiB for {knee['left_kl']:.2e} nats of solo KL")
    for row in report["alternatives"]:
        print(f"  {row['name']}: {row['plan_size']} projections, {row['bytes_saved'] / 2**20:.2f} MiB, "
              f"KL {row['kl']:.2e}, agreement {row['agreement']:.1%} (held-out)")
    if report.get("gate_held_out_prompts") is not None:
        print(f"gate: teacher-forced on the gate prompts and {report['gate_held_out_prompts']} of "
              f"{held['prompts']} held-out prompts through the served kernels")
    print(f"result: {report['status']}: {report['reason']}" + (f" (commit {report['commit'][:10]})" if report["commit"] else ""))
    if as_json:
        print_json(report)
