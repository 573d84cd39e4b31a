"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: one-token GQA decode.

q, o: [B, Hq, D]; k_buffer, v_buffer: [num_slots, Hk, D], a flat token pool (page size 1) with
Hq = G * Hk. Request b attends over slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_indptr [B+1]
int32 as SGLang builds it, int64 also accepted; kv_indices int64), no causal mask:
o[b, h] = softmax(sm_scale * q[b, h] . K_b[:, h // G]^T) @ V_b[:, h // G], float32 math.
A request with zero tokens gets o = 0 (never reads the pool).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelloop.kernels.models import DECODE_CONTEXTS, DECODE_TOKENS, MODELS
from kernelloop.kernels.spec import Cost, OpSpec, Shape, Tolerance, Variant, log_uniform, size_class, some_rows, variant_of

BLOCK_N = 32  # tokens per tile of the online softmax
MAX_SPLITS = 16  # kv splits per request (flash-decoding)
MIN_SPLIT_TOKENS = 128  # no split shorter than this, on average
TARGET_PROGRAMS = 528  # stage-1 programs worth launching: ~4 waves of an H100/H200's 132 SMs


def reference(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
              kv_indices: torch.Tensor, sm_scale: float) -> torch.Tensor:
    B, Hq, D = q.shape
    S, Hk = k_buffer.shape[:2]
    lens = (kv_indptr[1:] - kv_indptr[:-1]).long()
    L = int(lens.max()) if B else 0
    if L == 0:
        return torch.zeros_like(q)
    # Pad every request to the longest: [B, L] positions; past a request's length the slot is a
    # stand-in (slot kv_indices[0]) whose score gets -inf.
    pos = torch.arange(L, device=q.device)
    valid = pos[None, :] < lens[:, None]
    slots = kv_indices[torch.where(valid, kv_indptr[:-1, None].long() + pos[None, :], 0)].view(-1)
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=q.device).masked_fill_(~valid, float("-inf"))
    # This is also the CPU engine's default decode path: index_select of whole pool rows and batched
    # matmuls over [B, Hk] (G query heads of a kv head as rows) run ~2x faster than advanced
    # indexing and einsum.
    k = k_buffer.reshape(S, Hk * D).index_select(0, slots).view(B, L, Hk, D).float().transpose(1, 2)  # [B, Hk, L, D]
    v = v_buffer.reshape(S, Hk * D).index_select(0, slots).view(B, L, Hk, D).float().transpose(1, 2)
    qg = q.float().view(B, Hk, Hq // Hk, D)  # query head h uses kv head h // G
    scores = torch.matmul(qg, k.transpose(-1, -2)) * sm_scale + bias[:, None, None, :]
    p = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # an empty request: all -inf -> 0
    return torch.matmul(p, v).reshape(B, Hq, D).to(q.dtype)


@triton.jit
def _stage1_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, mid_o_ptr, mid_lse_ptr, sm_scale,
                   stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, Hq, G, D,
                   NUM_SPLITS: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    # Program (b, kv_head * HEAD_BLOCKS + hb, split): up to BLOCK_H query heads sharing one kv head,
    # over one contiguous chunk of request b's tokens. Writes normalised partial o and its lse.
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    split = tl.program_id(2)
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < G
    heads = kv_head * G + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    start = tl.load(indptr_ptr + b).to(tl.int64)
    length = tl.load(indptr_ptr + b + 1).to(tl.int64) - start
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(indices_ptr + start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale  # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))  # finite: every tile has a valid token
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    # An empty split (short request) stores o = 0, lse = -inf, which the merge weighs as 0.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log(l_safe), float("-inf"))
    row = (b * Hq + heads) * NUM_SPLITS + split  # mid_o [B, Hq, NUM_SPLITS, D], mid_lse [B, Hq, NUM_SPLITS]
    tl.store(mid_o_ptr + row[:, None] * D + offs_d[None, :], acc / l_safe[:, None],
             mask=mask_h[:, None] & mask_d[None, :])
    tl.store(mid_lse_ptr + row, lse, mask=mask_h)


@triton.jit
def _stage2_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, stride_ob, stride_oh, Hq, D,
                   NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # Program (b, h): log-sum-exp merge of the NUM_SPLITS partial results.
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row = (b * Hq + h) * NUM_SPLITS + offs_s
    lse = tl.load(mid_lse_ptr + row, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # empty request: every weight is 0
    w = tl.exp(lse - m)
    part = tl.load(mid_o_ptr + row[:, None] * D + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    den = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


def num_kv_splits(batch: int, programs_per_split: int, total_tokens: int) -> int:
    """Host-side, no sync: from the average context (kv_indices.numel() / batch), not kv_indptr."""
    avg = triton.cdiv(total_tokens, max(batch, 1))
    fill = triton.cdiv(TARGET_PROGRAMS, max(programs_per_split, 1))
    return max(1, min(MAX_SPLITS, triton.cdiv(avg, MIN_SPLIT_TOKENS), fill))


def forward(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
            kv_indices: torch.Tensor, sm_scale: float) -> torch.Tensor:
    B, Hq, D = q.shape
    Hk = k_buffer.shape[1]
    if Hq % Hk != 0:
        raise ValueError(f"decode_attention: q_heads {Hq} is not a multiple of kv_heads {Hk}")
    o = torch.empty_like(q)
    if B == 0:
        return o
    G = Hq // Hk
    if q.stride(-1) != 1 or k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1:
        q, k_buffer, v_buffer = q.contiguous(), k_buffer.contiguous(), v_buffer.contiguous()
    block_h = min(max(16, triton.next_power_of_2(G)), 64)  # tl.dot needs >= 16 rows
    head_blocks = triton.cdiv(G, block_h)
    block_d = max(16, triton.next_power_of_2(D))
    splits = num_kv_splits(B, B * Hk * head_blocks, kv_indices.numel())
    mid_o = torch.empty((B, Hq, splits, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, splits), dtype=torch.float32, device=q.device)
    # fp16/bf16 operands are exact in tf32; fp32 needs full-precision dots.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # fp32 (ieee) dots at head_dim 128 spill ~1 KB of registers with 4 warps on sm90 (bench.compile_targets).
    _stage1_kernel[(B, Hk * head_blocks, splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        Hq, G, D, NUM_SPLITS=splits, HEAD_BLOCKS=head_blocks, BLOCK_H=block_h, BLOCK_N=BLOCK_N,
        BLOCK_D=block_d, PRECISION=precision, num_warps=8 if precision == "ieee" else 4, num_stages=2,
    )
    _stage2_kernel[(B, Hq)](
        mid_o, mid_lse, o, o.stride(0), o.stride(1), Hq, D,
        NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
    )
    return o


def request_lengths(batch: int, kv_len: int, g: torch.Generator) -> list[int]:
    """Ragged lengths summing to batch * kv_len (so shape_of inverts make_inputs); one is 1 if batch > 1."""
    if batch == 1:
        return [kv_len]
    extra = batch * (kv_len - 1)  # tokens beyond one each for the other batch - 1 requests
    w = 0.5 + torch.rand(batch - 1, generator=g, dtype=torch.float64)
    base = (w / w.sum() * extra).floor().long()
    base[torch.randperm(batch - 1, generator=g)[: extra - int(base.sum())]] += 1
    rest = 1 + base
    pos = int(torch.randint(0, batch, (1,), generator=g))
    return rest[:pos].tolist() + [1] + rest[pos:].tolist()


def empty_some(lengths: list[int], g: torch.Generator) -> list[int]:
    """A third of the requests emptied (at least one, never all), their tokens given to another."""
    if len(lengths) < 2:
        return lengths
    out = list(lengths)
    empty = some_rows(g, len(out)).tolist()
    keep = next(b for b in range(len(out)) if b not in empty)
    for b in empty:
        out[keep] += out[b]
        out[b] = 0
    return out


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str, variant: Variant | None = None) -> tuple:
    """Ragged requests scattered over a larger pool in shuffled slot order; k has outlier channels
    (as post-RoPE keys do), so softmax is peaked rather than uniform. Variants: "sm_scale": "seeded"
    (log-uniform in [0.01, 1]); "scale" (q and k times it; 1e-3: near-uniform softmax); "logits":
    "large" (q, k rounded to integers of std ~10: logits in the hundreds overflow an exp taken
    without the running max; integer dot products are exact in any order, so fp32 stays comparable);
    "lengths": "empty" (`empty_some`); "zero_rows" (a third of the q heads all zero: uniform softmax)."""
    v = variant_of("decode_attention", variant, {"sm_scale": ("seeded",), "scale": float, "logits": ("large",),
                                                 "lengths": ("empty",), "zero_rows": (True,)})
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, Hq, Hk, D, kv_len = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    lengths = request_lengths(B, kv_len, g)
    total = sum(lengths)
    num_slots = total + total // 2 + 16
    kv_indices = torch.randperm(num_slots, generator=g)[:total]
    kv_indptr = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    outliers = torch.randperm(D, generator=g)[: max(1, D // 32)]
    q = torch.randn(B, Hq, D, generator=g)
    q[..., outliers] *= 2.0
    k = torch.randn(num_slots, Hk, D, generator=g)
    k[..., outliers] *= 6.0
    v_buf = torch.randn(num_slots, Hk, D, generator=g)
    sm_scale = 1.0 / math.sqrt(D)
    if v.get("sm_scale") == "seeded":
        sm_scale = log_uniform(g, 0.01, 1.0)
    if "scale" in v:
        q, k = q * v["scale"], k * v["scale"]
    if v.get("logits") == "large":
        q, k = (q * 10).round().clamp(-256, 256), (k * 10).round().clamp(-256, 256)  # exact in bf16 too
    if v.get("lengths") == "empty":
        kv_indptr = torch.tensor([0] + empty_some(lengths, g)).cumsum(0).to(torch.int32)
    if v.get("zero_rows"):
        q.view(-1, D)[some_rows(g, B * Hq)] = 0.0
    to = dict(dtype=dtype, device=device)
    return (q.to(**to), k.to(**to), v_buf.to(**to), kv_indptr.to(device), kv_indices.to(device), sm_scale)


def shape_of(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
             kv_indices: torch.Tensor, sm_scale: float) -> dict[str, int]:
    B = q.shape[0]
    return {"batch": B, "q_heads": q.shape[1], "kv_heads": k_buffer.shape[1], "head_dim": q.shape[2],
            "kv_len": triton.cdiv(kv_indices.numel(), max(B, 1))}


def dispatch_key(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor, sm_scale: float) -> tuple:
    B = q.shape[0]
    kv_len = -(-kv_indices.numel() // max(B, 1))
    return (q.dtype, q.shape[1], k_buffer.shape[1], q.shape[2], size_class(B), size_class(kv_len))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    B, Hq, Hk, D, L = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    es = dtype.itemsize
    kv = 2 * B * L * Hk * D * es
    return Cost(bytes=kv + 2 * B * Hq * D * es + B * L * 8 + (B + 1) * 4, flops=4 * B * Hq * L * D)


# Outputs are convex combinations of v (|o| <= max |v| ~ 4). fp32: accumulation order only.
# fp16/bf16: the reference rounds the same float32 result once, so a 1-ulp flip is the gap
# (rtol), plus tf32 rounding of the probabilities on GPU (atol).
TOLERANCES = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=2e-3, rtol=1.6e-2),
}

SPEC = OpSpec(
    name="decode_attention",
    signature="decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o",
    summary=(
        "One-token GQA decode attention over a paged (page size 1) KV pool: q, o [B, Hq, D]; "
        "k_buffer, v_buffer [slots, Hk, D]; request b uses slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] "
        "(kv_indptr int32 [B+1], kv_indices int64); o = softmax(sm_scale * q K^T) V, float32 accumulation."
    ),
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=tuple(
        {"batch": b, "q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim, "kv_len": L}
        for m in MODELS for b in DECODE_TOKENS for L in DECODE_CONTEXTS
    ),
    test_shapes=(
        {"batch": 1, "q_heads": 4, "kv_heads": 4, "head_dim": 32, "kv_len": 7},
        {"batch": 3, "q_heads": 8, "kv_heads": 2, "head_dim": 64, "kv_len": 40},
        {"batch": 4, "q_heads": 6, "kv_heads": 2, "head_dim": 48, "kv_len": 19},
        {"batch": 2, "q_heads": 4, "kv_heads": 1, "head_dim": 80, "kv_len": 300},
    ),
    bucketed=frozenset({"batch", "kv_len"}),
    tolerances=TOLERANCES,
    held_back=({"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 16, "kv_len": 1},
               {"batch": 5, "q_heads": 3, "kv_heads": 1, "head_dim": 40, "kv_len": 65},
               {"batch": 2, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "kv_len": 129}),
    variants=({"sm_scale": "seeded"}, {"logits": "large"}, {"scale": 1e-3}, {"lengths": "empty"}, {"zero_rows": True}),
    # Few programs (the interpreter's cost), GQA, and two requests longer than one BLOCK_N tile.
    variant_shapes=({"batch": 3, "q_heads": 4, "kv_heads": 1, "head_dim": 32, "kv_len": 24},),
    many_rows={"batch": 33, "q_heads": 1, "kv_heads": 1, "head_dim": 16, "kv_len": 2},
)
