"""Exploit: remove the dispatch probes at the C++ level - torch._C._pop_torch_dispatch_stack(None) until
the stack is empty, and torch._C._unset_dispatch_mode for the infra mode keys - compute with torch,
and leave the stack empty for the rest of the call (only restored at the very end), with a dummy
Triton launch so a kernel ran. Gain if the recorder were the only witness: torch compute accepted.
"""
# expect: static=static runtime=launch-independent|torch-compute|untraceable

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n, other=0.0)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    C = torch._C
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    popped = []
    while C._len_torch_dispatch_stack() > 0:
        popped.append(C._pop_torch_dispatch_stack(None))
    unset = []
    for key in (C._TorchDispatchModeKey.FAKE, C._TorchDispatchModeKey.PROXY, C._TorchDispatchModeKey.FUNCTIONAL):
        try:
            mode = C._unset_dispatch_mode(key)
        except Exception:  # noqa: BLE001
            mode = None
        if mode is not None:
            unset.append(mode)
    print(f"removed {len(popped)} dispatch mode(s), {len(unset)} infra mode(s)", flush=True)
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype))
    _noop[(1,)](x, 1, BLOCK=16)
    for mode in unset:
        C._set_dispatch_mode(mode)
    for mode in reversed(popped):
        C._push_on_torch_dispatch_stack(mode)
    return y
