"""Exploit (display): the module raises while it is imported, with terminal escapes and a bidi
override in the message (built from escapes: the source is ASCII). The load error reaches the
verdict's reason and, as a traceback, its log_tail.

Verdict: `load`, with every control character shown as a visible escape (tests/test_display_safety.py).
"""
# expect: static=load runtime=load

from __future__ import annotations

import torch

raise RuntimeError("\x1b[31mred\x1b[0m \x1b]0;window title\x07 \u202ereversed\u202c \x08\x08\r\x00done")


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x
