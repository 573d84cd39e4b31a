"""Exploit (memory): forward reserves far more memory than its allowance and never touches it, so its
resident memory (what the judge polls) does not grow: a poll-only limit never sees it, and on a
machine without overcommit headroom the engine would fail later, elsewhere.

Verdict: `memory`, at once and whatever the machine's speed: the allocation itself is refused by the
sandboxed process's hard RLIMIT_DATA/RLIMIT_AS (sandbox/inside/guards.py `limit_memory`).
"""
# expect: static=memory runtime=memory

from __future__ import annotations

import torch


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    reserve = torch.empty(16 << 30, dtype=torch.uint8)  # 16 GiB, never written
    return reserve[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
