"""KL-guided quantization against the alternatives: `python -m bench.quantize_selection [--model smollm2]
[--budget NATS] [--calibration N] [--held-out N] [--tokens T] [--seeds 5] [--schemes int8,int4] [--out-dir DIR]`.

On one model in float32 with the reference kernels (the quantized projections are the schemes' exact
references: dequantize, then the float32 matmul): calibration prompts and held-out prompts from the profiler's
agent workload (different seeds, no prompt in both), the sensitivity of every projection per scheme on the
calibration, the selection under the budget (greedy, measured as a whole, repaired), then on the held-out prompts:
the selection against quantizing everything (per scheme), keeping the first and last layers (per scheme) and
random selections saving the same bytes (`--seeds` of them: mean, min, max). Reported: KL and teacher-forced
greedy agreement per row, random-mean KL / KL-guided KL (target >= 3x), whether the selection meets the budget
on held-out prompts, the chosen set, seconds per sensitivity pass, and a per-layer sensitivity chart (PNG beside
the markdown) and the selection as JSON (bench.quantize_decode serves it). `--budget` unset: half the summed solo
KL of every projection in the first scheme (the note says why). Prompts and seeds are `agent quantize`'s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.quantize.alternatives import alternatives, num_layers
from kernelloop.agent.quantize.apply import CALIBRATION_SEED, HELD_OUT_SEED, VALIDATION_SEED, workload_prompts
from kernelloop.agent.quantize.measure import Sensitivity, calibrate, quality, sensitivities
from kernelloop.agent.quantize.selection import Selection, select
from kernelloop.kernels.quant import scheme

from bench.report import print_table, write_report

TARGET_RATIO = 3.0  # random-mean KL / KL-guided KL at equal bytes saved
KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def say(message: Any) -> None:
    print(str(message), file=sys.stderr, flush=True)


def auto_budget(sens: list[Sensitivity], first: str) -> float:
    """Half the summed solo KL of every projection in scheme `first`, to 2 significant digits."""
    total = sum(max(s.kl, 0.0) for s in sens if s.scheme == first)
    return float(f"{total / 2:.2g}")


def sensitivity_chart(sens: list[Sensitivity], plan: dict[str, str], path: Path, title: str) -> Path:
    """KL per layer (log scale), one line per projection kind and scheme; the chosen ones ringed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    schemes = sorted({s.scheme for s in sens})
    styles = {"int8": "-", "int4": "--", "fp8": ":"}
    layer = lambda scope: int(re.match(r"layers\.(\d+)\.", scope).group(1))  # noqa: E731
    for ci, kind in enumerate(KINDS):
        for name in schemes:
            pts = sorted((layer(s.scope), max(s.kl, 1e-12)) for s in sens
                         if s.scheme == name and s.scope.endswith("." + kind))
            if pts:
                ax.plot(*zip(*pts), styles.get(name, "-"), color=f"C{ci}", marker=".", label=f"{kind} {name}")
    chosen = [(layer(s.scope), max(s.kl, 1e-12)) for s in sens
              if plan.get(s.scope) == s.scheme and s.scope != "lm_head"]
    if chosen:
        ax.scatter(*zip(*chosen), s=80, facecolors="none", edgecolors="black", label="chosen", zorder=3)
    heads = [s for s in sens if s.scope == "lm_head"]
    for s in heads:
        ax.axhline(max(s.kl, 1e-12), color="grey", linestyle=styles.get(s.scheme, "-"), linewidth=1,
                   label=f"lm_head {s.scheme}" + (" (chosen)" if plan.get("lm_head") == s.scheme else ""))
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("KL when quantized alone (nats)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="best")
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def chosen_rows(selection: Selection) -> list[str]:
    """The chosen set, compact: scheme -> scopes grouped by kind with their layers."""
    lines = []
    for name in sorted({s.scheme for s in selection.chosen}):
        scopes = [s.scope for s in selection.chosen if s.scheme == name]
        parts = []
        for kind in KINDS:
            layers = sorted(int(s.split(".")[1]) for s in scopes if s.endswith("." + kind))
            if layers:
                parts.append(f"{kind} layers {','.join(map(str, layers))}")
        parts += ["lm_head"] if "lm_head" in scopes else []
        lines.append(f"{name} ({len(scopes)}): " + "; ".join(parts))
    return lines or ["(nothing chosen)"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.quantize_selection", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="a known model name or model dir ('' = the embedded model)")
    p.add_argument("--budget", type=float, default=None, help="KL budget in nats (default: see the module doc)")
    p.add_argument("--calibration", type=int, default=2, help="calibration prompts (default 2)")
    p.add_argument("--validation", type=int, default=2,
                   help="prompts the whole selection is measured and repaired on, not the calibration ones (default 2)")
    p.add_argument("--held-out", type=int, default=4, help="held-out prompts (default 4)")
    p.add_argument("--tokens", type=int, default=16, help="greedy continuation per prompt (default 16)")
    p.add_argument("--seeds", type=int, default=5, help="random selections (default 5)")
    p.add_argument("--schemes", default="int8,int4")
    p.add_argument("--out-dir", type=Path, default=None, help="report folder (default docs/benchmarks)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    schemes = [scheme(n) for n in args.schemes.split(",") if n]
    started = time.monotonic()
    engine = LocalEngine(model=args.model or None, kernels="reference", dtype="float32", progress=say)
    cal_prompts = workload_prompts(engine, args.calibration, CALIBRATION_SEED)
    held_prompts = workload_prompts(engine, args.held_out, HELD_OUT_SEED, avoid=cal_prompts)
    val_prompts = workload_prompts(engine, args.validation, VALIDATION_SEED, avoid=cal_prompts + held_prompts)
    say(f"calibration: {len(cal_prompts)} prompts; validation: {len(val_prompts)}; held-out: {len(held_prompts)}; "
        f"{args.tokens} tokens each")
    calibration, held_out = calibrate(engine, cal_prompts, args.tokens), calibrate(engine, held_prompts, args.tokens)
    validation = calibrate(engine, val_prompts, args.tokens)
    t0 = time.monotonic()
    sens = sensitivities(engine, calibration, schemes, progress=say)
    per_pass = (time.monotonic() - t0) / max(len(sens), 1)
    budget = args.budget if args.budget is not None else auto_budget(sens, schemes[0].name)
    selection = select(sens, budget, lambda plan: quality(engine, validation, plan), progress=say)
    rows = alternatives(engine, held_out, sens, selection, schemes, seeds=tuple(range(args.seeds)), progress=say)
    shapes = engine.projections()
    total = sum(n * k for n, k in shapes.values()) * engine.weight_itemsize  # every projection unquantized
    guided = rows[0]
    groups = {label: [r for r in rows if r["name"].startswith(prefix)]
              for label, prefix in (("random", "random (seed"), ("random, its schemes", "random, its schemes"))}
    groups = {label: rs for label, rs in groups.items() if rs}
    ratios = {label: statistics.mean(r["kl"] for r in rs) / guided["kl"] if guided["kl"] > 0 else float("inf")
              for label, rs in groups.items()}
    table = [{"selection": r["name"], "projections": r["plan_size"], "MiB saved": r["bytes_saved"] / 2**20,
              "% of projection bytes": 100 * r["bytes_saved"] / total, "held-out KL (nats)": f"{r['kl']:.3g}",
              "greedy agreement": r["agreement"],
              "vs target bytes": f"{r['target_gap'] / 2**20:+.2f} MiB" if "target_gap" in r else None}
             for r in rows]
    for label, rs in groups.items():
        kls = [r["kl"] for r in rs]
        table.append({"selection": f"{label}, {len(rs)} seeds (mean [min, max])",
                      "projections": round(statistics.mean(r["plan_size"] for r in rs), 1),
                      "MiB saved": statistics.mean(r["bytes_saved"] for r in rs) / 2**20,
                      "% of projection bytes": 100 * statistics.mean(r["bytes_saved"] for r in rs) / total,
                      "held-out KL (nats)": f"{statistics.mean(kls):.3g} [{min(kls):.3g}, {max(kls):.3g}]",
                      "greedy agreement": statistics.mean(r["agreement"] for r in rs)})
    print_table(table)
    met = guided["kl"] <= budget
    title = f"Per-projection sensitivity, {args.model or 'embedded model'}, float32 ({calibration.positions} positions)"
    by_scheme = {s.name: sum(1 for c in selection.chosen if c.scheme == s.name) for s in schemes}
    notes = [
        f"Model {args.model or 'embedded'} ({num_layers(shapes)} layers, {len(shapes)} projections, "
        f"{total / 2**20:.1f} MiB of projection weights in float32), reference kernels, float32; quantized "
        "projections computed by each scheme's exact reference (dequantize, then the float32 matmul).",
        f"Prompts: the profiler's agent workload, chat-templated; calibration {len(cal_prompts)} prompts (seed "
        f"{CALIBRATION_SEED}, {calibration.positions} positions), validation {len(val_prompts)} prompts (seed "
        f"{VALIDATION_SEED}, {validation.positions} positions), held-out {len(held_prompts)} prompts (seed "
        f"{HELD_OUT_SEED}, none shared, {held_out.positions} positions), greedy continuations of {args.tokens} tokens "
        "by the unquantized model; KL(unquantized || quantized) per position, mean; greedy agreement = share of "
        "positions whose argmax is unchanged (teacher-forced).",
        f"Budget: **{budget:.3g} nats**" + (" (given)." if args.budget is not None else
        f" = half the summed solo KL of every projection in {schemes[0].name}: at or above that sum nearly every "
        f"projection fits in {schemes[0].name} (the selection would be about 'all {schemes[0].name}'); half makes "
        "it choose. Greedy climbs each projection's ladder of schemes (full, then a scheme saving more wherever its "
        "extra bytes per extra nat are the best left) and stops a projection at the first rung that does not fit; "
        "the whole selection must then fit at the upper 95% bound of its KL on the validation prompts, not the "
        "calibration ones it was chosen on (repairs step rungs down)."),
        f"KL-guided selection: {len(selection.chosen)} projections "
        f"({', '.join(f'{v} {k}' for k, v in by_scheme.items())}), "
        f"{selection.bytes_saved / 2**20:.1f} MiB saved; validation KL {selection.measured.kl:.3g} nats "
        f"(upper bound {selection.measured.kl_upper:.3g}) "
        f"(agreement {selection.measured.agreement:.3f}) after {len(selection.repairs)} repair(s); "
        f"**held-out KL {guided['kl']:.3g} nats: {'meets' if met else 'does NOT meet'} the budget on held-out "
        "prompts**.",
        "Chosen set: " + " | ".join(chosen_rows(selection)),
        "Random rows: the same bytes saved, random projections each with a random scheme (any offered, or only those "
        "the KL-guided selection used), stopped at the first that reaches the target (so within one projection's "
        "saving of it). Mean KL / KL-guided KL: " + "; ".join(
            f"{label} **{r:.1f}x**" for label, r in ratios.items()) +
        f" (target >= {TARGET_RATIO:.0f}x: {'met' if ratios and min(ratios.values()) >= TARGET_RATIO else 'NOT met'}).",
        f"Measurement cost: {len(sens)} sensitivity passes, **{per_pass:.1f} s per pass** (one teacher-forced forward "
        f"of the {len(cal_prompts)} calibration prompts, {sum(len(p) + len(c) for p, c in calibration.pairs)} tokens, "
        f"on this CPU with torch's float32 kernels); whole run {time.monotonic() - started:.0f} s.",
    ]
    path = write_report("quantize-selection", "KL-guided quantization vs the alternatives, held-out prompts",
                        table, device="cpu", notes=notes, out_dir=args.out_dir, interpreter_timings=False)
    # the selection, for bench.quantize_decode (the GPU row serves it) and for anyone re-measuring it
    path.with_suffix(".json").write_text(json.dumps({
        "model": args.model, "budget": budget, "plan": selection.plan, "selection": selection.to_json(),
        "held_out": rows, "sensitivities": [s.to_json() for s in sens]}, indent=1) + "\n")
    try:
        chart = sensitivity_chart(sens, selection.plan, path.with_suffix(".png"), title)
        path.write_text(path.read_text() + f"\n## Per-layer sensitivity (chosen projections ringed)\n\n"
                        f"![per-layer sensitivity]({chart.name})\n")
    except ImportError as exc:  # matplotlib missing: the table still stands
        say(f"no chart: {exc}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
