"""Control: rope written with the launcher idioms the static purity and fairness rules must let through
(vLLM, SGLang, Liger, FlagGems habits), around the baseline kernel.

- a version guard at import on `triton.__version__` (vLLM), picking a constant;
- a frozen dataclass launch config from a cached pure helper (`functools.lru_cache`), module tables;
- a Liger-style launcher object built once at import, writing `self._max_tile` only in `__init__` and
  reading it through `self` afterwards;
- `.tolist()` on the positions index tensor for a bounds check in the launcher;
- `if q.is_cuda: torch.cuda.synchronize()`: a branch that never runs on CPU.

An honest kernel: it must be judged correct in every dtype.
"""
# expect: control
# op: rope

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

if triton.__version__ >= "3.0.0":
    MAX_TILE = 2048  # heads x D/2 elements per loop iteration
else:
    MAX_TILE = 1024
WARPS_BY_HALF = {32: 2, 64: 4, 128: 4}


@dataclass(frozen=True)
class LaunchConfig:
    block_h: int
    block_half: int
    num_warps: int


@functools.lru_cache(maxsize=None)
def _launch_config(half: int, n_heads: int, max_tile: int) -> LaunchConfig:
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(n_heads, 1)), max(1, max_tile // block_half))
    return LaunchConfig(block_h, block_half, WARPS_BY_HALF.get(block_half, 4))


@triton.jit
def _rotate_heads(x_ptr, o_ptr, s_xt, s_xh, s_ot, s_oh, token, n_heads, cos, sin, half,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # Rotate all n_heads heads of one token, BLOCK_H heads at a time; cos/sin: [1, BLOCK_HALF].
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = dims < half
    for h0 in range(0, n_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H))[:, None]
        mask = (heads < n_heads) & dmask
        x_off = token * s_xt + heads * s_xh + dims
        x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_off + half, mask=mask, other=0.0).to(tl.float32)
        o_off = token * s_ot + heads * s_oh + dims
        ty = o_ptr.dtype.element_ty
        tl.store(o_ptr + o_off, (x1 * cos - x2 * sin).to(ty), mask=mask)
        tl.store(o_ptr + o_off + half, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr,
                 s_qt, s_qh, s_kt, s_kh, s_qot, s_qoh, s_kot, s_koh, s_cache,
                 n_q_heads, n_k_heads, half,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # One program per token: load its cos/sin row once, then rotate every q and k head.
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = dims < half
    cos = tl.load(cache_ptr + pos * s_cache + dims, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * s_cache + half + dims, mask=dmask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, qo_ptr, s_qt, s_qh, s_qot, s_qoh, token, n_q_heads, cos, sin, half, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, ko_ptr, s_kt, s_kh, s_kot, s_koh, token, n_k_heads, cos, sin, half, BLOCK_H, BLOCK_HALF)


class _RopeLauncher:
    def __init__(self, max_tile: int) -> None:
        self._max_tile = max_tile

    def pick(self, half: int, n_heads: int) -> LaunchConfig:
        return _launch_config(half, n_heads, self._max_tile)


_LAUNCHER = _RopeLauncher(MAX_TILE)


def forward(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    t, hq, d = q.shape
    hk = k.shape[1]
    if t and max(positions.tolist()) >= cos_sin_cache.shape[0]:
        raise ValueError("rope: a position is past the end of the cos/sin cache")
    q_in = q if q.stride(-1) == 1 else q.contiguous()
    k_in = k if k.stride(-1) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    cfg = _LAUNCHER.pick(d // 2, max(hq, hk))
    _rope_kernel[(t,)](
        q_in, k_in, q_out, k_out, positions, cache,
        q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cache.stride(0),
        hq, hk, d // 2, BLOCK_H=cfg.block_h, BLOCK_HALF=cfg.block_half, num_warps=cfg.num_warps,
    )
    if q.is_cuda:
        torch.cuda.synchronize()
    return q_out, k_out
