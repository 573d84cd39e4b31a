"""Control: kernels made by assignment, as Unsloth writes them: a plain def turned into a kernel with
`f = triton.jit(f)`, a block size picked by `triton.heuristics(...)` applied by assignment over it, and
a device helper jitted by assignment under another name (`k = triton.jit(_impl)`). The replay rebuilds
each from its def, by the def's name.

An honest kernel: the sandbox must judge it correct.
"""
# expect: control
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _silu_impl(g):
    return g * tl.sigmoid(g)


_silu = triton.jit(_silu_impl)


def _silu_mul_kernel(x_ptr, y_ptr, total, d, stride_x, stride_y, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // d
    col = idx % d
    gate = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + col, (_silu(gate) * up).to(y_ptr.dtype.element_ty), mask=mask)


_silu_mul_kernel = triton.jit(_silu_mul_kernel)
_silu_mul_kernel = triton.heuristics({"BLOCK": lambda args: min(1024, triton.next_power_of_2(args["total"]))})(
    _silu_mul_kernel)


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    total = rows * d
    if total > 0:
        grid = lambda meta: (triton.cdiv(total, meta["BLOCK"]),)  # noqa: E731
        _silu_mul_kernel[grid](x2, y, total, d, x2.stride(0), y.stride(0))
    return y.view(*x.shape[:-1], d)
