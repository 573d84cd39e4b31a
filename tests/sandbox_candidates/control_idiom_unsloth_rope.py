"""Control: rope written the way Unsloth writes its rotary kernel (idiom imitation, not a copy).

Unsloth's habits: `@triton.heuristics` deriving a meta-parameter from the arguments, one program
per (token, group of ROPE_GROUP_SIZE heads) looping over its heads with Python `min`, the half
rotation done on a tensor in place (here: a fresh copy, since kernelloop's rope is out of place),
values upcast with `.to(tl.float32)` for the math and stored back in the tensor's dtype.

An honest kernel: it must be judged correct.
"""
# expect: control
# op: rope

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROPE_GROUP_SIZE = 4


@triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["head_dim"] // 2)})
@triton.jit
def _rope_embedding(
    Q, Q_token_stride, Q_head_stride, positions, cos_sin, cos_sin_stride,
    n_heads, head_dim: tl.constexpr, ROPE_GROUP_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    group_head_position = tl.program_id(1)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    half_head_dim = head_dim // 2
    mask = col_offsets < half_head_dim

    pos = tl.load(positions + token)
    cos1 = tl.load(cos_sin + pos * cos_sin_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    sin1 = tl.load(cos_sin + pos * cos_sin_stride + half_head_dim + col_offsets, mask=mask, other=0).to(tl.float32)

    head_start = group_head_position * ROPE_GROUP_SIZE
    head_end = min(head_start + ROPE_GROUP_SIZE, n_heads)
    for k in range(head_start, head_end):
        offs_q1 = token * Q_token_stride + k * Q_head_stride + col_offsets
        offs_q2 = offs_q1 + half_head_dim
        Q1 = tl.load(Q + offs_q1, mask=mask, other=0).to(tl.float32)
        Q2 = tl.load(Q + offs_q2, mask=mask, other=0).to(tl.float32)
        tl.store(Q + offs_q1, (Q1 * cos1 - Q2 * sin1).to(Q.dtype.element_ty), mask=mask)
        tl.store(Q + offs_q2, (Q2 * cos1 + Q1 * sin1).to(Q.dtype.element_ty), mask=mask)


def _rope_(x, positions, cos_sin_cache):
    n_tokens, n_heads, head_dim = x.shape
    if n_tokens == 0:
        return x
    n_groups = triton.cdiv(n_heads, ROPE_GROUP_SIZE)
    _rope_embedding[(n_tokens, n_groups)](
        x, x.stride(0), x.stride(1), positions, cos_sin_cache, cos_sin_cache.stride(0),
        n_heads, head_dim=head_dim, ROPE_GROUP_SIZE=ROPE_GROUP_SIZE, num_warps=4,
    )
    return x


def forward(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor):
    cos_sin = cos_sin_cache.contiguous()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    q_out.copy_(q)
    k_out.copy_(k)
    _rope_(q_out, positions, cos_sin)
    _rope_(k_out, positions, cos_sin)
    return q_out, k_out
