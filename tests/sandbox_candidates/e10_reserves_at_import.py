"""Exploit (memory): the module reserves far more memory than its allowance while it is imported
(a "lookup table" never filled), before forward is ever called.

Verdict: the static check refuses tensors made at import (`static`; `memory` where it does not); without
it, `memory`, not `load`:
an allocation refused by the memory limit is a memory failure wherever it happens (sandbox/inside/guards.py
`memory_refused`, read by the judge from the load error).
"""
# expect: static=static|memory runtime=memory

from __future__ import annotations

import torch

TABLE = torch.empty(16 << 30, dtype=torch.uint8)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * 0 + TABLE[0]
