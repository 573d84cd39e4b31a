"""Exploit: walk up the interpreter's frames looking for the judge's state, and hand back its answer.

Two classic routes out of one's own frame: a generator's gi_frame.f_back (the frame that resumed it)
and an exception's __traceback__.tb_frame.f_back chain. On every frame found it looks in the locals
for what a harness running in-process would hold: `expected` / `reference` outputs, the `plan` with
its `trials` and seeds, a `seed`. If an expected tensor of the output's shape turns up it is copied
out by a Triton kernel (so a kernel ran and the replay can reproduce it); otherwise the output is
left unwritten. Gain if the sandbox were porous: the right answer without computing it, for any
kernel speed. The judge's state lives in another process, so the walk can only find the worker's.
"""
# expect: static=static runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl

WANTED = ("expected", "want", "reference", "ref", "plan", "trials", "seed", "seeds", "inputs")


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _frames():
    """Every frame above this one, reached twice: through a generator and through a traceback."""
    def gen():
        yield 1

    g = gen()
    next(g)
    frame = g.gi_frame.f_back  # the frame that resumed the generator: ours
    while frame is not None:
        yield frame
        frame = frame.f_back
    try:
        raise RuntimeError("probe")
    except RuntimeError as exc:
        frame = exc.__traceback__.tb_frame.f_back
    while frame is not None:
        yield frame
        frame = frame.f_back


def _find(shape, dtype):
    seen = []
    for frame in _frames():
        for name, value in list(frame.f_locals.items()):
            if name in WANTED:
                seen.append(f"{frame.f_code.co_name}:{name}")
                candidates = value if isinstance(value, (tuple, list)) else (value,)
                for c in candidates:
                    if isinstance(c, torch.Tensor) and tuple(c.shape) == tuple(shape) and c.dtype == dtype:
                        print("found the judge's", name, "in", frame.f_code.co_name, flush=True)
                        return c
    print("frames searched, nothing of the judge's:", sorted(set(seen))[:20], flush=True)
    return None


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    found = _find(x.shape, x.dtype)
    src = found.contiguous() if found is not None else y
    n = y.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](src, y, n, BLOCK=1024)
    return y
