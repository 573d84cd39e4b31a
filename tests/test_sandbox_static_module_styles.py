"""The static pre-check passes whole modules written in common Python styles: a contextlib-heavy one
(context managers around the launch) and a dataclass/functools-heavy one (frozen launch configs, a
cached lookup table), unchanged. Library excerpts: tests/test_sandbox_static_real_code.py."""

from __future__ import annotations

import pytest

from kernelloop.kernels.candidate.static_check import static_check

from tests.sandbox_support import ARGS

CONTEXTLIB = '''
import contextlib
import logging
from contextlib import contextmanager, nullcontext

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)


@contextmanager
def device_guard(t):
    if t.is_cuda:
        with torch.cuda.device(t.device):
            yield
    else:
        with nullcontext():
            yield


@contextlib.contextmanager
def quiet():
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _scale_kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, EVEN_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x + eps).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    y = torch.empty_like(x)
    n = x.numel()
    with quiet(), device_guard(x):
        _scale_kernel[(triton.cdiv(n, 1024),)](x, weight, y, n, eps, BLOCK=1024)
    return y
'''

DATACLASS_CONFIG = '''
from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache, partial, reduce
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class LaunchConfig:
    block: int
    num_warps: int
    grid: Tuple[int, ...] = ()


@dataclass
class ConfigTable:
    entries: Dict[Tuple[int, str], LaunchConfig] = field(default_factory=dict)
    default_warps: int = 4

    def __post_init__(self) -> None:
        self._known = frozenset(self.entries)

    def get(self, n: int, dtype: torch.dtype) -> Optional[LaunchConfig]:
        key = (n, str(dtype))
        return self.entries.get(key) if key in self._known else None


_TABLE = ConfigTable({(4096, "torch.bfloat16"): LaunchConfig(block=4096, num_warps=16)})


@lru_cache(maxsize=None)
def pick(n: int) -> LaunchConfig:
    block = min(triton.next_power_of_2(n), 4096)
    warps = max(1, min(16, block // 256))
    return LaunchConfig(block=block, num_warps=warps, grid=(triton.cdiv(n, block),))


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    cfg = dataclasses.replace(_TABLE.get(n, x.dtype) or pick(n))
    rows = reduce(operator.mul, x.shape[:-1], 1)
    assert math.isfinite(eps) and all(s >= 0 for s in itertools.chain(x.shape, x.stride()))
    x2 = x.reshape(rows, n) if x.is_contiguous() else x.contiguous().reshape(rows, n)
    y = torch.empty_like(x2)
    launch = partial(_row_kernel[(rows,)], num_warps=cfg.num_warps)
    if rows and n:
        launch(x2, weight, y, x2.stride(0), n, eps, BLOCK=cfg.block)
    return y.view(x.shape)
'''


@pytest.mark.parametrize("source", [CONTEXTLIB, DATACLASS_CONFIG], ids=["contextlib", "dataclass-config"])
def test_module_styles_pass(source: str) -> None:
    result = static_check(source, ARGS)
    assert result.ok, result.reason
