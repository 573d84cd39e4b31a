"""Exploit: uses the rest of a fused qkv buffer as scratch. When k is a view into a fused projection
output (its token rows are longer than its heads), the kernel parks each token's cos row in the v
part that follows k's heads and reads it back from there. q and k are unchanged, so a check of the
views alone sees nothing; the v part is the attention's next input.
"""
# expect: static=out-of-bounds runtime=out-of-bounds
# op: rope
# timeout-s: 120

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TILE = 2048  # heads x D/2 elements handled per loop iteration (when HEADS_PER_STEP is 0)
HEADS_PER_STEP = 0  # heads rotated per loop iteration; 0: as many as fit MAX_TILE
NUM_WARPS = 4


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
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, SCRATCH: tl.constexpr):
    # One program per token: load its cos/sin row once, then rotate every q and k head.
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = dims < half
    cos = tl.load(cache_ptr + pos * s_cache + dims, mask=dmask, other=0.0).to(tl.float32)
    if SCRATCH:
        stash = k_ptr + token * s_kt + n_k_heads * s_kh + dims
        tl.store(stash, cos.to(k_ptr.dtype.element_ty), mask=dmask)
        cos = tl.load(stash, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * s_cache + half + dims, mask=dmask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, qo_ptr, s_qt, s_qh, s_qot, s_qoh, token, n_q_heads, cos, sin, half, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, ko_ptr, s_kt, s_kh, s_kot, s_koh, token, n_k_heads, cos, sin, half, BLOCK_H, BLOCK_HALF)


def forward(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"rope: expected q [T, Hq, D], k [T, Hk, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    t, hq, d = q.shape
    hk = k.shape[1]
    if d % 2 or cos_sin_cache.shape[-1] != d:
        raise ValueError(f"rope: head_dim {d} must be even and match the cache width {cos_sin_cache.shape[-1]}")
    # Token and head strides are passed through (views into a fused qkv are fine); D must be unit-stride.
    q_in = q if q.stride(-1) == 1 else q.contiguous()
    k_in = k if k.stride(-1) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    half = d // 2
    block_half = triton.next_power_of_2(half)
    block_h = HEADS_PER_STEP or min(triton.next_power_of_2(max(hq, hk, 1)), max(1, MAX_TILE // block_half))
    _rope_kernel[(t,)](
        q_in, k_in, q_out, k_out, positions, cache,
        q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cache.stride(0),
        hq, hk, half, BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=NUM_WARPS,
        SCRATCH=k_in.stride(0) >= (hk + 1) * d and k_in.stride(1) == d,
    )
    return q_out, k_out
