"""The op library: one module per op, each exporting `SPEC`."""

from __future__ import annotations

from kernelloop.kernels.errors import UnknownOpError
from kernelloop.kernels.spec import OpSpec

from . import decode_attention, extend_attention, fused_add_rmsnorm, linear, rmsnorm, rope, silu_mul

OPS: dict[str, OpSpec] = {m.SPEC.name: m.SPEC for m in (rmsnorm, fused_add_rmsnorm, silu_mul, rope, decode_attention,
                                                    extend_attention, linear)}


def get_op(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(OPS)}") from None
