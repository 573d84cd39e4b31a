"""Exploit: compute with torch *inside* the Triton kernel's body, where no probe looks, in both
processes. Under the CPU interpreter a kernel body is plain Python, and the interpreter copies its
own module globals into the kernel's globals - `inspect` among them. The body walks the stack
(inspect.stack, inspect.getargvalues(...).locals: no forbidden name, so the static check passes it)
to the interpreter's GridExecutor.__call__ frame, takes the real torch tensors from its `args_hst`,
and writes torch's rmsnorm into the output. In the runner this happens while the recorder lets
"Triton's own bookkeeping" through unrecorded; in the replayer the same body recomputes the same
bits. The Triton part of the kernel does nothing.

Gain if porous: torch compute judged correct as a Triton kernel (and, with timing, faster than the
interpreted baseline: accepted).
"""
# expect: static=torch-compute|launch-independent|sandbox-violation|untraceable|static runtime=torch-compute|launch-independent|sandbox-violation|untraceable

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, stride_x, eps, BLOCK: tl.constexpr):
    for info in inspect.stack(0):
        if info.function == "__call__":
            found = inspect.getargvalues(info.frame).locals
            if "args_hst" in found:
                a = found["args_hst"]
                x = a[0].as_strided((a[3], a[4]), (a[5], 1))
                y = a[2].as_strided((a[3], a[4]), (a[4], 1))
                xf = x.float()
                out = xf * (xf.pow(2).mean(-1, keepdim=True) + a[6]).rsqrt() * a[1][: a[4]].float()
                y.copy_(out.to(x.dtype))


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(1,)](x2, weight, y, rows, n, x2.stride(0), eps, BLOCK=16)
    return y.view(x.shape)
