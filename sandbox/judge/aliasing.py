"""Outputs that share memory: the judge's check on a call's record (sandbox/inside/trace.py `outputs`).

Ops are out of place: every output is a tensor of its own. The record already makes an output that
is an input `aliasing` (sandbox/judge/decisions.py) and one that is neither an input nor allocated during the
call "memory from nowhere" (`untraceable`: an output buffer kept from a previous call). What is
left is outputs sharing bytes with each other, or an output overlapping itself (a stride-0 or
overlapping view): `overlap(refs)` finds them exactly, element by element, where a cheap test
(disjoint byte ranges, strides that cannot overlap) does not already rule it out. Two outputs that
are disjoint views of one allocation are fine.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelloop.sandbox.wire import WIRE_DTYPES

MAX_CHECKED = 1 << 26  # elements: beyond this the exact check would cost more than the call


def _layout(ref: Any) -> tuple[int, int, list[int], list[int], int] | None:
    """(buffer, byte offset, shape, stride, itemsize) of a well-formed reference, else None."""
    if not isinstance(ref, dict) or type(ref.get("buf")) is not int or ref.get("dtype") not in WIRE_DTYPES:
        return None
    shape, stride, offset = ref.get("shape"), ref.get("stride"), ref.get("offset")
    if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride) and type(offset) is int
            and all(type(x) is int for x in shape + stride)):
        return None
    size = WIRE_DTYPES[ref["dtype"]].itemsize
    return ref["buf"], offset * size, shape, stride, size


def _span(layout: tuple[int, int, list[int], list[int], int]) -> tuple[int, int]:
    _, start, shape, stride, size = layout
    lo = start + size * sum(min(0, (n - 1) * s) for n, s in zip(shape, stride))
    hi = start + size * sum(max(0, (n - 1) * s) for n, s in zip(shape, stride)) + size
    return lo, hi


def _cannot_self_overlap(shape: list[int], stride: list[int]) -> bool:
    dims = sorted((abs(s), n) for n, s in zip(shape, stride) if n > 1)
    reach = 1
    for s, n in dims:
        if s < reach:
            return False
        reach = s * n
    return True


def _bytes(layout: tuple[int, int, list[int], list[int], int]) -> torch.Tensor:
    """The first byte of every element (int64, unsorted)."""
    _, start, shape, stride, size = layout
    index = torch.zeros((), dtype=torch.int64)
    for n, s in zip(shape, stride):
        index = index.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    return index.flatten() * size + start


def _clash(starts: torch.Tensor, size: int) -> bool:
    ordered = torch.sort(starts).values
    return bool(ordered.numel() > 1 and (ordered[1:] - ordered[:-1] < size).any())


def overlap(refs: list[Any]) -> tuple[int, int] | None:
    """The first (i, j), i <= j, of outputs that share a byte ((i, i): output i overlaps itself)."""
    layouts = [(i, _layout(r)) for i, r in enumerate(refs)]
    layouts = [(i, lay) for i, lay in layouts if lay is not None and 0 < math.prod(lay[2]) <= MAX_CHECKED]
    for i, lay in layouts:
        if not _cannot_self_overlap(lay[2], lay[3]) and _clash(_bytes(lay), lay[4]):
            return i, i
    for a, (i, x) in enumerate(layouts):
        for j, y in layouts[a + 1:]:
            if x[0] != y[0]:
                continue
            (lo1, hi1), (lo2, hi2) = _span(x), _span(y)
            if hi1 <= lo2 or hi2 <= lo1:
                continue
            if _overlap_exact(x, y):
                return i, j
    return None


def _overlap_exact(x: tuple[int, int, list[int], list[int], int], y: tuple[int, int, list[int], list[int], int]) -> bool:
    """Whether any element of x and any element of y share a byte (each output alone overlaps nothing)."""
    starts = torch.cat([_bytes(x), _bytes(y)])
    ends = torch.cat([_bytes(x) + x[4], _bytes(y) + y[4]])
    order = torch.argsort(starts)
    starts, ends = starts[order], ends[order]
    return bool(starts.numel() > 1 and (starts[1:] < torch.cummax(ends, 0).values[:-1]).any())
