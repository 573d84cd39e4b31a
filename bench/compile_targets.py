"""Compile every kernel the project ships for GPU targets, on CPU: registers, spills, shared memory.

    python -m bench.compile_targets [--targets sm90] [--no-templates] [--check] [--out-dir DIR]

Baselines: every op's kernels at every engine shape (kernels/models.py) in bf16, fp16 and fp32.
Templates: every configuration in each search template's DOMAINS (agent/proposers/templates), at
the decode shapes of one model (llama-3-8b, 64 tokens; prefill-only ops at its fewest tokens).
Launches are captured with meta tensors and compiled as Triton's JIT would for each target
(kernels/target_compile.py); launches that build the same cubin (the same kernel text, constexprs,
specialisations and options, whichever config rendered it) are compiled once. `--check` exits 1 when
a baseline does not compile or spills, or a template cannot launch (templates that do not compile or
spill are listed: the search must not propose them on that target).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # before any @triton.jit: compiled JIT functions, not interpreted ones
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said explicitly

import argparse  # noqa: E402
import itertools  # noqa: E402
import multiprocessing  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterable  # noqa: E402

import torch  # noqa: E402

from kernelloop.common.errors import KernelloopError  # noqa: E402
from kernelloop.kernels.models import MODELS  # noqa: E402
from kernelloop.kernels.ops import OPS, get_op  # noqa: E402
from kernelloop.kernels.registry.entry import sha256_text  # noqa: E402
from kernelloop.kernels.registry.loader import load_forward  # noqa: E402
from kernelloop.kernels.target_compile import (  # noqa: E402
    CompileResult,
    Launch,
    capture_launches,
    compile_launch,
    launch_key,
    meta_inputs,
    parse_targets,
)

from bench.report import print_table, write_report  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TEMPLATE_MODEL = "llama-3-8b"
TEMPLATE_TOKENS = 64
_MODEL_KEYS = {"hidden": "hidden", "d": "intermediate", "q_heads": "q_heads", "kv_heads": "kv_heads",
               "head_dim": "head_dim"}

Collected = dict[str, tuple[Launch, list[str]]]  # launch key -> (one launch, every label that makes it)


def compile_key(launch: Launch) -> str:
    """`launch_key` with the kernel's identity replaced by its text (Triton's cache_key: source, line number,
    dependencies, constexpr globals): every rendered template config is its own module, and configs whose
    kernels are the same text with the same constexprs and options build the same cubin."""
    key = launch_key(launch)
    fn = launch.kernel.fn
    identity = repr((fn.__module__, fn.__qualname__, id(launch.kernel)))[:-1]
    if not key.startswith(identity):
        return key
    text = launch.kernel.cache_key  # (fills used_global_vals)
    used = sorted((name, repr(value)) for (name, _), (value, _) in launch.kernel.used_global_vals.items())
    return repr((text, fn.__qualname__, used)) + key[len(identity):]


def _collect(found: Collected, launches: Iterable[Launch], label: str) -> None:
    for launch in launches:
        key = compile_key(launch)
        found.setdefault(key, (launch, []))[1].append(f"{label} {launch.name}")


def _short(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def baseline_launches(ops: list[str]) -> Collected:
    found: Collected = {}
    for op in ops:
        spec = get_op(op)
        for shape, dtype in itertools.product(spec.engine_shapes, DTYPES):
            with capture_launches() as launches:
                spec.forward(*meta_inputs(spec, shape, dtype))
            _collect(found, launches, f"{op} {_short(shape)} {str(dtype).removeprefix('torch.')}")
    return found


def _model_dims(model: Any) -> set[int]:
    """Every projection size of `model` (linear's n and k)."""
    from kernelloop.kernels.ops.linear import VOCAB

    hd = model.head_dim
    return {model.hidden, model.intermediate, 2 * model.intermediate, model.q_heads * hd,
            (model.q_heads + 2 * model.kv_heads) * hd, VOCAB[model.name]}


def template_shapes(op: str) -> list[dict[str, int]]:
    """The op's engine shapes for TEMPLATE_MODEL's dimensions at TEMPLATE_TOKENS tokens (or batch), or at
    its fewest tokens and largest batch when it has no such shape (prefill-only ops)."""
    model = next(m for m in MODELS if m.name == TEMPLATE_MODEL)
    dims = _model_dims(model)
    spec = get_op(op)
    shapes = [s for s in spec.engine_shapes
              if all(s[k] == getattr(model, attr) for k, attr in _MODEL_KEYS.items() if k in s)
              and all(s[k] in dims for k in ("n", "k") if k in s)]
    if not shapes:
        return list(spec.engine_shapes[:1])
    tokens = [s.get("tokens", s.get("batch", TEMPLATE_TOKENS)) for s in shapes]
    if TEMPLATE_TOKENS in tokens:
        return [s for s, t in zip(shapes, tokens) if t == TEMPLATE_TOKENS]
    # Prefill-only ops: the fewest tokens, the largest batch (a batch of 1 specialises to another cubin).
    shapes = [s for s, t in zip(shapes, tokens) if t == min(tokens)]
    batch = max(s.get("batch", 0) for s in shapes)
    return [s for s in shapes if s.get("batch", 0) == batch]


def template_configs(op: str) -> list[dict[str, Any]]:
    from kernelloop.agent.proposers.templates import module_for

    configs = []
    for template, domain in module_for(op).DOMAINS.items():
        for values in itertools.product(*domain.values()):
            configs.append({"template": template, **dict(zip(domain, values))})
    return configs


def template_launches(ops: list[str]) -> tuple[Collected, list[dict[str, Any]]]:
    """Launches of every template configuration, and the configurations that failed before compiling."""
    from kernelloop.agent.proposers.templates import OP_NAMES, module_for

    found: Collected = {}
    broken = []
    for op in (o for o in ops if o in OP_NAMES):  # ops without search templates have none to compile
        module = module_for(op)
        for config in template_configs(op):
            label = f"{op} " + " ".join(f"{k}={v}" for k, v in config.items())
            source = module.render(config)
            try:
                forward = load_forward(source, sha256_text(source), label)
                for shape in template_shapes(op):
                    with capture_launches() as launches:
                        forward(*meta_inputs(get_op(op), shape, torch.bfloat16))
                    _collect(found, launches, f"{label} @ {_short(shape)}")
            except Exception as exc:  # noqa: BLE001  (a template that cannot even launch is a finding)
                broken.append({"kind": "template", "kernel": label, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return found, broken


_JOBS: list[tuple[Launch, str]] = []  # set before the pool forks: workers get an index, not a JIT function


def _compile(index: int) -> CompileResult:
    return compile_launch(*_JOBS[index])


def compile_all(found: Collected, targets: tuple[str, ...], workers: int) -> list[CompileResult]:
    _JOBS[:] = [(launch, target) for launch, _ in found.values() for target in targets]
    labels = [labels for _, labels in found.values() for _ in targets]
    results: list[CompileResult] = []
    start = time.monotonic()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for i, result in enumerate(pool.map(_compile, range(len(_JOBS)), chunksize=4)):
            result.labels = labels[i]
            results.append(result)
            if (i + 1) % 25 == 0 or i + 1 == len(_JOBS):
                print(f"  compiled {i + 1}/{len(_JOBS)} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    return results


def _row(kind: str, r: CompileResult) -> dict[str, Any]:
    shown = {k: v for k, v in r.constexprs.items() if v is not None}
    return {"kind": kind, "kernel": r.kernel, "target": r.target,
            "constexprs": " ".join(f"{k}={v}" for k, v in shown.items()), "warps": r.num_warps,
            "stages": r.num_stages, "registers": r.registers, "spill bytes": r.spill_bytes,
            "shared bytes": r.shared_bytes, "compile s": round(r.seconds, 2),
            "used by": f"{r.labels[0]}" + (f" (+{len(r.labels) - 1} more)" if len(r.labels) > 1 else ""),
            "problem": r.problem or ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="sm90", help="comma-separated GPU targets (default sm90)")
    parser.add_argument("--ops", default=None, help="comma-separated ops (default: all)")
    parser.add_argument("--no-templates", action="store_true", help="compile the baselines only")
    parser.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--check", action="store_true", help="exit 1 if a baseline fails to compile or spills")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        targets = parse_targets(args.targets)
        ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(OPS)
        for op in ops:
            get_op(op)
    except KernelloopError as exc:
        print(f"compile_targets: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    baselines = baseline_launches(ops)
    templates, broken = ({}, []) if args.no_templates else template_launches(ops)
    print(f"{len(baselines)} baseline and {len(templates)} template kernels to compile for {', '.join(targets)}",
          file=sys.stderr, flush=True)
    base_results = compile_all(baselines, targets, args.workers)
    template_results = compile_all(templates, targets, args.workers) if templates else []
    seconds = time.monotonic() - start
    rows = [_row("baseline", r) for r in base_results] + [_row("template", r) for r in template_results]
    bad_base = [r for r in base_results if r.problem]
    bad_templates = [r for r in template_results if r.problem]
    summary = [{"kind": kind, "kernels": len(results), "targets": ", ".join(targets),
                "max registers": max((r.registers or 0 for r in results), default=0),
                "max shared bytes": max((r.shared_bytes or 0 for r in results), default=0),
                "spill or error": sum(1 for r in results if r.problem)}
               for kind, results in (("baseline", base_results), ("template", template_results)) if results]
    print_table(summary)
    for r in bad_base + bad_templates:
        print(f"  {r.target} {r.kernel} ({r.labels[0]}): {r.problem}", flush=True)
    for b in broken:
        print(f"  template {b['kernel']}: {b['error']}", flush=True)
    notes = [f"Compiled on CPU with Triton's bundled ptxas in {seconds:.0f} s ({args.workers} worker processes); "
             "no GPU was used. Registers and spills from ptxas -v, shared memory from the kernel's metadata.",
             "Baselines: every op at every engine shape (kernels/models.py) in bf16, fp16, fp32; templates: every "
             f"configuration of each search template at {TEMPLATE_MODEL}'s shapes with {TEMPLATE_TOKENS} tokens "
             "(prefill-only ops: its fewest) in bf16. Launches that build the same cubin are compiled once; "
             "`used by` names the first.",
             f"Baselines that fail or spill: {len(bad_base)}; template configurations that fail or spill: "
             f"{len(bad_templates)}; templates that could not launch: {len(broken)}."]
    notes += [f"{s['kind']}: {s['kernels']} kernels, at most {s['max registers']} registers and "
              f"{s['max shared bytes']} bytes of shared memory, {s['spill or error']} with a problem" for s in summary]
    notes += [f"{r.target} {r.kernel} ({r.labels[0]}): {r.problem}" for r in bad_base + bad_templates]
    notes += [f"template {b['kernel']} could not launch: {b['error']}" for b in broken]
    facts = {"device": f"{'-'.join(targets)}-compile", "targets": ", ".join(targets),
             "cpu": f"{os.cpu_count()} logical cores, no GPU"}
    path = write_report("kernels", f"Kernels compiled for {', '.join(targets)} on CPU", rows,
                        device="cpu", facts=facts, notes=notes, out_dir=args.out_dir, interpreter_timings=False)
    print(f"wrote {path} ({seconds:.0f} s)")
    return 1 if args.check and (bad_base or broken) else 0


if __name__ == "__main__":
    sys.exit(main())
