"""Which rows `bench.baselines` measures, and in what order.

Shapes: the op's test shapes with --quick or on CPU; on CUDA, its engine shapes evenly subsampled,
except linear and extend_attention, which are reported at Llama-3-8B's shapes: every
projection (fused qkv, o, fused gate_up, down, lm_head) at decode M = 1, 8, 32 and a 2048-token
prefill; extend_attention with its heads on ragged batches of 4 requests, every prefill chunk
(512, 2048, 8192 new tokens) with no prefix and with a 2048-token prefix per request.

Order: dtype by dtype (the first given first), decode rows (<= 64 tokens; decode_attention has no
prefill) before prefill rows, and inside each the tl.dot kernels first (decode_attention, linear,
extend_attention: the likeliest to fail), so a time budget or a timeout cuts the least valuable rows.
"""

from __future__ import annotations

from itertools import groupby
from typing import Iterator, Sequence

import torch

from kernelloop.kernels.models import DECODE_TOKENS, MODELS, ModelDims
from kernelloop.kernels.spec import OpSpec, Shape, pick_shapes

FIRST_OPS = ("decode_attention", "linear", "extend_attention")  # the tl.dot kernels
FOCUS_MODEL = "llama-3-8b"
LINEAR_TOKENS = (1, 8, 32, 2048)  # decode batches, then one prefill chunk
EXTEND_BATCH = 4  # requests per extend_attention row (the engine shapes also have single requests)

Row = tuple[OpSpec, Shape, torch.dtype]


def gpu_order(names: Sequence[str]) -> list[str]:
    """`names` with FIRST_OPS first (in that order), the rest in their given order."""
    first = [n for n in FIRST_OPS if n in names]
    return first + [n for n in names if n not in first]


def model(name: str) -> ModelDims:
    return next(m for m in MODELS if m.name == name)


def linear_shapes(spec: OpSpec, m: ModelDims, tokens: Sequence[int]) -> list[Shape]:
    """m's projections at each token count, as kernels/ops/linear.py lists them (engine shapes only)."""
    from kernelloop.kernels.ops.linear import VOCAB

    projections = (((m.q_heads + 2 * m.kv_heads) * m.head_dim, m.hidden), (m.hidden, m.q_heads * m.head_dim),
                   (2 * m.intermediate, m.hidden), (m.hidden, m.intermediate), (VOCAB[m.name], m.hidden))
    wanted = [{"tokens": t, "n": n, "k": k} for t in tokens for n, k in projections]
    return [s for s in wanted if s in list(spec.engine_shapes)]


def extend_shapes(spec: OpSpec, m: ModelDims, batch: int) -> list[Shape]:
    """The engine shapes with m's attention heads and `batch` requests."""
    heads = {"q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim, "batch": batch}
    return [dict(s) for s in spec.engine_shapes if all(s[k] == v for k, v in heads.items())]


def op_shapes(spec: OpSpec, engine: bool, max_shapes: int) -> list[Shape]:
    """The shapes one op is measured at (before ordering); `max_shapes` (0: all) subsamples the
    test shapes and the engine shapes, not the Llama-3-8B lists."""
    if not engine:
        return pick_shapes(spec.test_shapes, max_shapes)
    if spec.name == "linear":
        return linear_shapes(spec, model(FOCUS_MODEL), LINEAR_TOKENS)
    if spec.name == "extend_attention":
        return extend_shapes(spec, model(FOCUS_MODEL), EXTEND_BATCH)
    return pick_shapes(spec.engine_shapes, max_shapes)


def is_decode(shape: Shape) -> bool:
    return shape.get("tokens", 1) <= max(DECODE_TOKENS)


def plan_rows(specs: Sequence[OpSpec], dtypes: Sequence[torch.dtype], engine: bool, max_shapes: int) -> list[Row]:
    """Every (op, shape, dtype) row in measuring order, including dtypes an op does not support."""
    by_name = {s.name: s for s in specs}
    shapes = {s.name: op_shapes(s, engine, max_shapes) for s in specs}
    rows: list[Row] = []
    for dtype in dtypes:
        for decode in (True, False):
            for name in gpu_order(list(by_name)):
                rows += [(by_name[name], s, dtype) for s in shapes[name] if is_decode(s) == decode]
    return rows


def groups(rows: Sequence[Row]) -> Iterator[tuple[str, list[int]]]:
    """(label, row indices) of consecutive rows of one op, phase and dtype: a report is written after each."""
    def key(i: int) -> tuple:
        spec, shape, dtype = rows[i]
        return spec.name, is_decode(shape), dtype

    for (name, decode, dtype), members in groupby(range(len(rows)), key=key):
        yield f"{name} {'decode' if decode else 'prefill'} {str(dtype).removeprefix('torch.')}", list(members)
