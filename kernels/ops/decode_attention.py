"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: one-token GQA decode.

q, o: [B, Hq, D]; k_buffer, v_buffer: [num_slots, Hk, D], a flat token pool (page size 1) with
Hq = G * Hk. Request b attends over slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_indptr [B+1]
int32 as SGLang builds it, int64 also accepted; kv_indices int64), no causal mask:
o[b, h] = softmax(sm_scale * q[b, h] . K_b[:, h // G]^T) @ V_b[:, h // G], float32 math.
A request with zero tokens gets o = 0 (never reads the pool).
The spec; the baseline kernel is kernels/ops/decode_attention_kernel.py.
"""

from __future__ import annotations

import math

import torch
import triton

from kernelloop.kernels.inputs import log_uniform, some_rows, variant_of
from kernelloop.kernels.models import DECODE_CONTEXTS, DECODE_TOKENS, MODELS
from kernelloop.kernels.ops.decode_attention_kernel import forward
from kernelloop.kernels.spec import Cost, OpSpec, Shape, Tolerance, Variant, size_class


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


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
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
    # Real head layouts (llama-3-8b, SmolLM2) at short lengths, one request of 8191 tokens (batch 2: the
    # other has one), and many requests at short lengths (the 17-128 bucket's top; 512 (request, head) rows).
    range_shapes=({"batch": 1, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "kv_len": 16},
                  {"batch": 3, "q_heads": 9, "kv_heads": 3, "head_dim": 64, "kv_len": 33},
                  {"batch": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 16, "kv_len": 4096},
                  {"batch": 128, "q_heads": 4, "kv_heads": 1, "head_dim": 16, "kv_len": 2}),
)
