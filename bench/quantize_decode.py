"""Decode tokens/s at batch 1 with a quantization selection served from the registry, against unquantized:
`python -m bench.quantize_decode [--selection FILE] [--rounds 3] [--out-dir DIR] [--rehearse]`.

The selection (scope -> scheme; default: the newest docs/benchmarks/*-quantize-selection.json, written by
bench.quantize_selection on SmolLM2-135M) is committed to a temporary registry as scoped entries (one
Registry.replace_scoped commit, sources the schemes' baseline kernels, as `agent quantize` commits them) on top
of a commit with no selection, and served by an Engine(kernels="registry") of a SmolLM2-135M-shaped model with
seeded random weights in bfloat16 (speed does not depend on the values; the GPU machine has no checkpoint). The
engine alternates between the two commits (`reload_kernels`, CUDA graphs recaptured) `--rounds` times, the order
flipping each round; each side's figure is its median. Exit 1 when a quantized projection was not served by its
registry kernel (a fallback would measure something users do not get).

`--rehearse` runs the same path on CPU (Triton's interpreter) with the embedded model in bfloat16 (as on the
GPU), a two-projection selection, 4-token prompts and 3 new tokens, the ops outside the selection by their torch
references; its numbers time the interpreter, nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.quantize.alternatives import plan_bytes_saved
from kernelloop.agent.quantize.apply import Judged, scoped_entries
from kernelloop.engine.scheduler import SchedulerConfig
from kernelloop.kernels.device import Fingerprint
from kernelloop.kernels.ops import baseline_source
from kernelloop.kernels.quant import scheme
from kernelloop.kernels.registry import Registry

from bench.engine_gpu import engine_decode, write_model_dir
from bench.rehearse import step_device
from bench.report import DEFAULT_OUT_DIR, print_table, write_report

STEP = "bench.quantize_decode"
SMOLLM2_135M = {  # SmolLM2-135M-Instruct's config (engine/model_source.py KNOWN_MODELS["smollm2"])
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "rope_theta": 100000.0, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}
REHEARSAL_PLAN = {"layers.0.down_proj": "int8", "layers.1.qkv_proj": "int4"}
# (dtype, prompt tokens, new tokens, KV-cache bytes): the GPU run and its CPU rehearsal
GPU_RUN = ("bfloat16", 128, 128, 1 << 30)
REHEARSAL = ("bfloat16", 4, 3, 32 << 20)


def newest_selection(folder: Path = DEFAULT_OUT_DIR) -> Path | None:
    found = sorted(folder.glob("*-quantize-selection.json"))
    return found[-1] if found else None


def commit_plan(registry: Registry, plan: dict[str, str], fingerprint: Fingerprint, dtype: str) -> tuple[str, str]:
    """(the commit with no selection, the commit with `plan`): entries as `agent quantize` writes them, the
    schemes' baseline kernels (judged by the sandbox steps and tests, not here: this step measures speed)."""
    unjudged = SimpleNamespace(batch_invariant=None)
    judged = {name: Judged(scheme(name), baseline_source(scheme(name).op), unjudged) for name in set(plan.values())}
    none = registry.replace_scoped(fingerprint, dtype, [], "no selection")
    return none, registry.replace_scoped(fingerprint, dtype, scoped_entries(plan, judged, fingerprint, dtype),
                                         f"{STEP}: {len(plan)} projections")


def served_by_registry(variants: dict[str, dict[str, str]], plan: dict[str, str]) -> list[str]:
    """The planned scopes not served by their registry kernel (each "op@scope: variant")."""
    bad = []
    for scope, name in sorted(plan.items()):
        used = variants.get(f"{scheme(name).op}@{scope}", {})
        if not used or any(not v.startswith("registry:") for v in used.values()):
            bad.append(f"{scheme(name).op}@{scope}: {', '.join(sorted(set(used.values()))) or 'never called'}")
    return bad


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {STEP}", description=__doc__.splitlines()[0])
    p.add_argument("--selection", type=Path, default=None, help="JSON with a 'plan' (default: the newest committed)")
    p.add_argument("--rounds", type=int, default=None, 
                   help="alternations of unquantized and quantized (default 3; rehearsal 1)")
    p.add_argument("--rehearse", action="store_true",
                   help="this step's path on CPU (TRITON_INTERPRET=1), embedded model, a two-projection selection")
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.rehearse else 3)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = step_device(args.rehearse, STEP)
    if device is None:
        return 2
    dtype, prompt_len, new_tokens, kv_bytes = REHEARSAL if args.rehearse else GPU_RUN
    if args.rehearse:
        plan, source = dict(REHEARSAL_PLAN), "rehearsal plan"
    else:
        path = args.selection or newest_selection()
        if path is None or not path.is_file():
            print(f"{STEP}: no selection file (run bench.quantize_selection, or pass --selection FILE)",
                  file=sys.stderr)
            return 2
        plan, source = json.loads(path.read_text())["plan"], path.name
    with tempfile.TemporaryDirectory() as tmp:
        registry = Registry(Path(tmp) / "registry")
        fingerprint = device.fingerprint
        unquantized, quantized = commit_plan(registry, plan, fingerprint, dtype)
        model = None if args.rehearse else str(write_model_dir(Path(tmp), SMOLLM2_135M))
        # rehearsal: the ops outside the selection by their torch references, so the interpreter runs only the
        # quantized projections' registry kernels (the path this step proves) and the step stays short
        handle = LocalEngine(model=model, device=device, dtype=dtype, kernels="registry", registry=str(registry.path),
                             fallback="reference" if args.rehearse else "baseline",
                             random_weights=not args.rehearse, kv_cache_bytes=kv_bytes,
                             scheduler=SchedulerConfig(max_running_requests=1))
        engine = handle.engine
        shapes = handle.projections()
        missing = sorted(set(plan) - set(shapes))
        if missing:
            print(f"{STEP}: the selection names projections this model lacks: {', '.join(missing[:3])}",
                  file=sys.stderr)
            return 2
        full = sum(n * k for n, k in shapes.values()) * handle.weight_itemsize
        saved = plan_bytes_saved(shapes, plan, handle.weight_itemsize)
        tps: dict[str, list[float]] = {"unquantized": [], "quantized": []}
        variants: dict[str, dict[str, str]] = {}
        sides = [("unquantized", unquantized), ("quantized", quantized)]
        for r in range(args.rounds):
            for label, revision in sides if r % 2 == 0 else sides[::-1]:
                engine.reload_kernels(revision)
                engine_decode(engine, 1, prompt_len, 1 if args.rehearse else 4)  # warm-up: compiles, quantizes once
                m = engine_decode(engine, 1, prompt_len, new_tokens)
                tps[label].append(m["decode_tokens"] / m["decode_s"])
                if label == "quantized":
                    variants = engine.kernels.variants_in_use()
                print(f"  round {r + 1}/{args.rounds} {label}: {tps[label][-1]:.1f} tok/s", file=sys.stderr, flush=True)
        graphs = "on" if engine.graphs is not None else "off"
    counts = {n: sum(1 for v in plan.values() if v == n) for n in sorted(set(plan.values()))}
    base = statistics.median(tps["unquantized"])
    rows: list[dict[str, Any]] = []
    for label in ("unquantized", "quantized"):
        med = statistics.median(tps[label])
        what = "unquantized" if label == "unquantized" else \
            f"selection: {len(plan)} projections ({', '.join(f'{v} {k}' for k, v in counts.items())})"
        weights = full - (saved if label == "quantized" else 0)
        rows.append({"serving": what, "projection weights (MiB)": weights / 2**20,
                     "decode tok/s (median)": round(med, 1),
                     "rounds": ", ".join(f"{t:.1f}" for t in tps[label]), "vs unquantized": f"{med / base:.2f}x"})
    print_table(rows)
    bad = served_by_registry(variants, plan)
    shape = "embedded model (rehearsal)" if args.rehearse else "SmolLM2-135M shape, random weights"
    notes = [
        f"{shape}, {dtype} on {device}, kernels=registry (a temporary registry: one commit with no selection, one "
        f"with the selection's scoped entries); CUDA graphs {graphs}. Selection: {source}.",
        f"Batch 1, prompts {prompt_len} tokens, {new_tokens} new tokens, greedy, EOS ignored; decode tok/s counts the "
        f"steps after prefill; {args.rounds} rounds alternating the two commits (order flipped each round), median.",
        f"Projection weights read per decode step: {full / 2**20:.1f} MiB unquantized, "
        f"{(full - saved) / 2**20:.1f} MiB "
        "with the selection (values plus scales); the tied embedding table is read as the lm_head's weight.",
        "Quantized projections served by: " + ("their registry kernels (every one)" if not bad else
                                                "NOT their registry kernels: " + "; ".join(bad)),
    ]
    path = write_report("quantize-decode", f"Decode at batch 1: a quantization selection vs unquantized ({shape})",
                        rows, device=device.torch, notes=notes, out_dir=args.out_dir)
    print(f"wrote {path}")
    if bad:
        print(f"{STEP}: quantized projections not served by their registry kernels: {'; '.join(bad[:3])}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
