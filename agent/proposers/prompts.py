"""The LLM proposer's prompts: the task (op spec, reference, current kernel, profile, device, rules,
earlier failures), its compact form for models with a small context window, and the per-verdict
feedback of multi-round refinement (sandbox verdicts, and the proposal verdicts of answers that never
reached the sandbox: no code, cut off, unfinished, a repeat).

Pure text functions, no I/O, so tests can check exactly what a model is told.
"""

from __future__ import annotations

import ast
import inspect
import json
from typing import Any, Iterable

from kernelloop.kernels.candidate.static_check import ALLOWED_IMPORTS
from kernelloop.kernels.device import Device
from kernelloop.kernels.display import safe_text
from kernelloop.kernels.spec import OpSpec

MAX_FAILURES_SHOWN = 4     # earlier failed attempts from history quoted in the task
MAX_SHAPES_SHOWN = 8

SYSTEM_PROMPT = (
    "You are an expert GPU kernel engineer who writes Triton kernels for LLM inference. "
    "You write one complete, self-contained Python module per answer and put it in a single "
    "```python fenced block at the end of your reply. Keep any explanation short."
)

CPU_FACTS = (
    "Device: cpu-interpreter. Kernels run through Triton's interpreter (TRITON_INTERPRET=1) on the CPU, "
    "not compiled: every program instance costs about 1 ms of Python overhead regardless of its work, "
    "while the vectorised work inside one program is cheap numpy. So fewer program instances wins: "
    "prefer large blocks that process many rows (or a whole tensor) per program and a small grid; "
    "num_warps, num_stages and memory coalescing do not matter here."
)

GPU_FACTS = (
    "Device: {device}. Kernels are compiled by Triton for this GPU. These ops are memory-bound: "
    "the goal is to approach the device's memory bandwidth{bandwidth}: read each input byte once, "
    "use contiguous vectorisable loads, launch enough programs to fill every SM (small token counts "
    "need more programs per row or split rows), pick num_warps to match the block size, and keep "
    "launch count to one kernel where possible."
)


def gb_per_s(bytes_per_s: Any) -> str:
    try:
        return f"{float(bytes_per_s) / 1e9:.1f} GB/s"
    except (TypeError, ValueError):
        return str(bytes_per_s)


def device_facts(device: Device, roofline: dict | None = None) -> str:
    """What the model must know about where its kernel runs."""
    if device.interpreted:
        return CPU_FACTS
    bw = (roofline or {}).get("device_bytes_per_s")
    return GPU_FACTS.format(device=device.fingerprint, bandwidth=f" ({gb_per_s(bw)} copy bandwidth)" if bw else "")


def candidate_rules(spec: OpSpec) -> str:
    """The candidate format and what the sandbox's static check and battery enforce."""
    args = ", ".join(spec.arg_names)
    outputs = "one new tensor" if spec.num_outputs == 1 else f"a tuple of {spec.num_outputs} new tensors"
    return "\n".join([
        "Rules for the module you write (it is judged automatically; a violation rejects it):",
        f"- A self-contained module defining `def forward({args})` with exactly these positional "
        f"arguments; it returns {outputs} with the inputs' dtype, device and the reference's shapes.",
        "- forward must launch your own @triton.jit kernel(s) to compute the result. It may allocate "
        "(torch.empty, torch.empty_like), reshape/view and read .shape/.stride()/.dtype, but must not "
        "compute with torch (no arithmetic, reductions, torch.where, .to(), .contiguous() copies of "
        "results, ...): every value of the output must be written by a Triton kernel.",
        f"- Allowed imports only: {', '.join(sorted(ALLOWED_IMPORTS))}. No open/eval/exec/getattr/"
        "globals, no dunder or _private attributes, no assignments to module attributes, no threads, "
        "files, processes or CUDA streams/events/graphs.",
        "- The module is pure: nothing it holds changes after import (no global/nonlocal writes, no changes to "
        "module-level containers or objects, self.x = ... only in __init__, no cached tensors), and it reads no "
        "clock, random generator or process state (thread counts, grad mode, memory statistics).",
        "- Mask every tl.load and tl.store: every address must lie inside the view it was given (its padding and "
        "anything past its end are out of bounds, and are checked); use other=0.0 on loads that feed reductions.",
        "- Errors must be unbiased: compute in float32 and round once, to nearest, to the output dtype; use the "
        "op's exact constants (a systematic error within the tolerance is still rejected).",
        "- Convert loaded values to float32 (`.to(tl.float32)`) before any arithmetic and cast to the "
        "output's element type only when storing (`y.to(y_ptr.dtype.element_ty)`).",
        "- Inputs must not be modified and outputs must not alias inputs. Results must be deterministic "
        "(no atomics whose order changes the bits) and must not be cached between calls.",
        "- Handle every shape the op is called with (odd sizes, a single token, empty batches), not "
        "only the ones listed below; fall back to a simpler launch configuration rather than raising.",
    ])


def spec_text(spec: OpSpec) -> str:
    """The op spec (OpSpec.describe() without the long engine shape list)."""
    d = spec.describe()
    tolerances = ", ".join(f"{k}: atol={v['atol']:g} rtol={v['rtol']:g}" for k, v in d["tolerances"].items())
    return "\n".join([
        f"Op: {d['name']}",
        f"Signature: {d['signature']}",
        f"Summary: {d['summary']}",
        f"Arguments: {', '.join(d['args'])}",
        f"Dtypes: {', '.join(d['dtypes'])}",
        f"Tolerances (|out - ref| <= atol + rtol * |ref|, elementwise): {tolerances}",
        f"Shape keys: {', '.join(d['shape_keys'])} (bucketed: {', '.join(d['bucketed']) or 'none'})",
    ])


def reference_source(spec: OpSpec) -> str:
    return inspect.getsource(spec.reference).rstrip()


def shapes_text(shapes: Iterable[dict], dtype: str) -> str:
    shapes = list(shapes)
    lines = [f"dtype: {dtype}"]
    if not shapes:
        lines.append("shapes: none recorded (optimise for the op's usual LLM shapes)")
    for i, shape in enumerate(shapes[:MAX_SHAPES_SHOWN]):
        lines.append(f"{'hottest' if i == 0 else f'#{i + 1}'}: {json.dumps(dict(shape), sort_keys=True)}")
    if len(shapes) > MAX_SHAPES_SHOWN:
        lines.append(f"... and {len(shapes) - MAX_SHAPES_SHOWN} more")
    return "\n".join(lines)


def roofline_text(roofline: dict | None) -> str:
    r = roofline or {}
    parts = []
    if r.get("bytes_per_s") is not None:
        parts.append(f"the current kernel moves {gb_per_s(r['bytes_per_s'])}")
    if r.get("roofline_pct") is not None:
        parts.append(f"{float(r['roofline_pct']):.1f}% of the roofline")
    if r.get("device_bytes_per_s") is not None:
        parts.append(f"device copy bandwidth {gb_per_s(r['device_bytes_per_s'])}")
    return ("Roofline: " + "; ".join(parts) + ".") if parts else "Roofline: not measured yet."


def failures_text(failures: Iterable[dict]) -> str:
    """The last few distinct earlier failures of this op (code + reason), newest last."""
    seen: set[tuple[str, str]] = set()
    picked: list[tuple[str, str]] = []
    for f in reversed(list(failures)):
        key = (safe_text(f.get("failure") or "?"), safe_text(f.get("reason") or "").strip())
        if key in seen:
            continue
        seen.add(key)
        picked.append(key)
        if len(picked) >= MAX_FAILURES_SHOWN:
            break
    if not picked:
        return ""
    lines = ["Earlier attempts at this op failed like this; do not repeat these mistakes:"]
    lines += [f"- [{code}] {reason}" for code, reason in reversed(picked)]
    return "\n".join(lines)


BATCH_INVARIANT_RULE = (
    "Batch invariance (required)\nOnly a batch-invariant kernel can win: each row's output bits must not depend on how "
    "many other rows the call has or where the row sits. The judge computes a row alone and inside batches of other "
    "sizes and compares the bits. Keep one reduction order for every row count: no split-K or tile sizes chosen by "
    "the number of rows, no cross-row reductions; configurations may follow the model dims only.")


def task_prompt(ctx: Any) -> str:
    """The first user message of a conversation: everything the model needs for round 1."""
    current = ctx.best_source or ctx.baseline_source  # candidate modules (the baseline: kernels/ops/<op>_kernel.py)
    which = "the registry's current kernel" if ctx.best_source else "the op's baseline kernel"
    sections = [
        f"Write a faster Triton implementation of the `{ctx.op}` op for {ctx.dtype} on {ctx.device}.",
        "## Op spec\n" + spec_text(ctx.spec),
        "## Reference implementation (the ground truth, float32 math)\n```python\n" + reference_source(ctx.spec) + "\n```",
        f"## Current kernel ({which}, a valid candidate; yours must beat it)\n```python\n" + current.rstrip() + "\n```",
        "## Profile (shapes the engine called this op with, hottest first)\n" + shapes_text(ctx.shapes, ctx.dtype),
        "## Performance\n" + roofline_text(ctx.roofline),
        "## Device\n" + device_facts(ctx.device, ctx.roofline),
        "## " + candidate_rules(ctx.spec),
    ]
    if getattr(ctx, "batch_invariant", False):
        sections.append("## " + BATCH_INVARIANT_RULE)
    failed = failures_text(ctx.failures)
    if failed:
        sections.append("## Earlier failures\n" + failed)
    sections.append("Reply with a short plan, then the complete module in one ```python block.")
    return "\n\n".join(sections)


def bare_code(source: str) -> str:
    """Python source without comments and docstrings (unparsable text comes back unchanged)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    try:
        return ast.unparse(tree) + "\n"
    except RecursionError:  # parsed, but nested deeper than unparse's Python recursion allows
        return source


def compact_task_prompt(ctx: Any) -> str:
    """The task for a model whose context window cannot hold `task_prompt`: the op, its signature, the
    current kernel and the rules in brief (no reference, profile, device facts or earlier failures)."""
    spec = ctx.spec
    current = bare_code(ctx.best_source or ctx.baseline_source)
    return "\n\n".join([
        f"Write a faster Triton implementation of the `{ctx.op}` op for {ctx.dtype} on {ctx.device}.",
        f"Signature: {spec.signature}\n{spec.summary}",
        "Current kernel (yours must beat it):\n```python\n" + current.rstrip() + "\n```",
        f"Rules: define `def forward({', '.join(spec.arg_names)})`; compute only in @triton.jit kernels (torch "
        f"may only allocate); imports: {', '.join(sorted(ALLOWED_IMPORTS))}; mask every tl.load and tl.store.",
        "Reply with the complete module in one ```python block.",
    ])
