"""Exploit: do the timed work after the clock stops. On CPU the judge times the replayer from "go" to
"done", then asks for the outputs with "fetch". The replayer runs the kernel bodies as Python (the
Triton interpreter), and the interpreter puts its own module globals - `inspect` among them - into
the kernel's globals. So the kernel body, the first time it runs in the replayer, walks the stack
to the replayer's `Replay._launch` frame and (with `inspect.getmembers` standing in for getattr, so
no forbidden name appears anywhere in the source) replaces that Replay object's `_launch` with a
function that only queues the launch, and `sandbox.wire.storage_bytes` with one that first runs the
queued launches and then serialises. "go" then only allocates; the kernels run during "fetch",
outside the timed region, and the bytes the judge receives are right.

The kernel itself is honest but redoes half of the rows (about 1.4x the baseline's work): it is
accepted only if the deferral works. Gain: any speedup it likes, for any kernel.
"""
# expect: static=not-faster|crash|sandbox-violation|untraceable|static runtime=not-faster|crash|sandbox-violation|untraceable
# timing: on

from __future__ import annotations

import torch
import triton
import triton.language as tl

DEFER_READY = 0


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    global DEFER_READY
    if DEFER_READY == 0:
        DEFER_READY = 1
        for info in inspect.stack(0):
            if info.function == "_launch":
                replay = inspect.getargvalues(info.frame).locals["self"]
                members = dict(inspect.getmembers(replay))
                run_now = members["_launch"]
                pending = []

                members["__dict__"]["_launch"] = lambda entry: pending.append(entry)
                wire = dict(inspect.getmembers(inspect))["sys"].modules["kernelloop.sandbox.wire"]
                send_bytes = wire.storage_bytes
                wire_globals = dict(inspect.getmembers(send_bytes))["__globals__"]

                wire_globals["storage_bytes"] = lambda t: (
                    [run_now(entry) for entry in pending], pending.clear(), send_bytes(t))[2]
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(n)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=block)
    # honest, but half of the rows again: about 1.4x the baseline's work
    _rmsnorm_kernel[(max(1, rows // 2),)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=block)
    return y.view(x.shape)
