"""extend_attention(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale) -> o: causal
GQA prefill ("extend", as SGLang names it) of a batch of new tokens over each request's cached prefix.

q, o: [T, Hq, D], the new tokens of all requests packed by request; k, v: [T, Hk, D] their keys and
values (Hq = G * Hk). Request b's new tokens are rows qo_indptr[b]:qo_indptr[b+1] (qo_indptr [B+1]
int32, int64 accepted). Its cached prefix is the pool slots kv_indices[kv_indptr[b]:kv_indptr[b+1]]
of k_buffer, v_buffer [num_slots, Hk, D] (page size 1; kv_indptr [B+1] int32, kv_indices int64);
the prefix may be empty, and kv_indices may run past kv_indptr[B] (the tail is never read). The new
tokens' own K/V are read from k, v, not from the pool. New token i of request b attends to its whole
prefix and to new tokens 0..i of its own request:
o[t, h] = softmax(sm_scale * q[t, h] . [K_prefix; K_new[:i+1]][:, h // G]^T) @ [V_prefix; V_new[:i+1]][:, h // G],
float32 math. A request with no new tokens has no rows; qo_indptr[B] == T.

The spec; the baseline kernel is kernels/ops/extend_attention_kernel.py.
"""

from __future__ import annotations

import math

import torch
import triton

from kernelloop.kernels.inputs import log_uniform, some_rows, variant_of
from kernelloop.kernels.models import MODELS, PREFILL_TOKENS
from kernelloop.kernels.ops.extend_attention_kernel import forward
from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.spec import TOKEN_BUDGET, Cost, OpSpec, Shape, Tolerance, Variant, size_class

# Engine shapes: prefill chunks (new tokens per forward, all requests together) over these cached
# prefixes per request, in batches of these many requests.
PREFILL_PREFIXES: tuple[int, ...] = (0, 2048)
PREFILL_BATCHES: tuple[int, ...] = (1, 4)

REFERENCE_CHUNK = 1 << 26  # score elements the reference holds at once (256 MiB of float32)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
              qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
              sm_scale: float) -> torch.Tensor:
    T, Hq, D = q.shape
    Hk = k.shape[1]
    G = Hq // Hk
    out = torch.zeros((T, Hq, D), dtype=torch.float32, device=q.device)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    with full_precision_matmuls():
        for b in range(len(qo) - 1):
            s, n = qo[b], qo[b + 1] - qo[b]
            if n <= 0:
                continue  # no new tokens: no rows
            slots = kv_indices[kvp[b]:kvp[b + 1]]
            p = slots.numel()
            keys = torch.cat([k_buffer[slots], k[s:s + n]]).float().transpose(0, 1)  # [Hk, p + n, D]: prefix, new
            values = torch.cat([v_buffer[slots], v[s:s + n]]).float().transpose(0, 1)
            rows = max(1, REFERENCE_CHUNK // (Hq * (p + n)))
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                m, seen = r1 - r0, p + r1  # no row of this chunk sees a key past new token r1 - 1
                # [Hk, m * G, D]: row i * G + g is new token r0 + i, query head kv_head * G + g
                qg = q[s + r0:s + r1].float().view(m, Hk, G, D).transpose(0, 1).reshape(Hk, m * G, D)
                # q . k first, then the scale (alpha=sm_scale would scale inside the products)
                scores = torch.bmm(qg, keys[:, :seen].transpose(1, 2)).mul_(sm_scale)
                # New token i (at position p + i) sees keys 0 .. p + i (never none): -inf past them.
                hidden = torch.ones((m, seen), dtype=torch.bool, device=q.device).triu_(p + r0 + 1)
                scores.view(Hk, m, G, seen).masked_fill_(hidden[None, :, None, :], float("-inf"))
                o = torch.bmm(scores.softmax(dim=-1), values[:, :seen])  # [Hk, m * G, D]
                out[s + r0:s + r1] = o.view(Hk, m, G, D).transpose(0, 1).reshape(m, Hq, D)
    return out.to(q.dtype)


# --- Inputs -------------------------------------------------------------------------------------


def new_lengths(batch: int, tokens: int, g: torch.Generator) -> list[int]:
    """Ragged new-token counts summing to `tokens`, each >= 1; one request has a single new token
    (when batch > 1)."""
    if tokens < batch:
        raise ValueError(f"extend_attention: {tokens} new tokens cannot fill {batch} requests")
    if batch == 1:
        return [tokens]
    extra = tokens - batch  # beyond one each for the other batch - 1 requests
    w = 0.5 + torch.rand(batch - 1, generator=g, dtype=torch.float64)
    base = (w / w.sum() * extra).floor().long()
    base[torch.randperm(batch - 1, generator=g)[: extra - int(base.sum())]] += 1
    rest = (1 + base).tolist()
    pos = int(torch.randint(0, batch, (1,), generator=g))
    return rest[:pos] + [1] + rest[pos:]


def empty_some(lengths: list[int], g: torch.Generator) -> list[int]:
    """A third of the requests emptied (at least one, never all), their tokens given to another (as
    decode_attention's "lengths": "empty" does)."""
    if len(lengths) < 2:
        return lengths
    out = list(lengths)
    empty = some_rows(g, len(out)).tolist()
    keep = next(b for b in range(len(out)) if b not in empty)
    for b in empty:
        out[keep] += out[b]
        out[b] = 0
    return out


def prefix_lengths(new: list[int], prefix: int, g: torch.Generator) -> list[int]:
    """Ragged prefix lengths summing to len(new) * prefix: about a third of the requests (never all,
    never the one with the fewest new tokens) have none, the rest share the total unevenly."""
    B = len(new)
    if prefix == 0:
        return [0] * B
    if B == 1:
        return [prefix]
    single = min(range(B), key=lambda b: new[b])  # a decode-like request: few new tokens after a prefix
    others = [b for b in range(B) if b != single]
    empty = {others[i] for i in some_rows(g, len(others)).tolist()}
    if len(empty) == len(others) and len(others) > 1:
        empty.discard(others[0])
    full = [b for b in range(B) if b not in empty]
    w = 0.5 + torch.rand(len(full), generator=g, dtype=torch.float64)
    total = B * prefix
    share = (w / w.sum() * total).floor().long()
    share[torch.randperm(len(full), generator=g)[: total - int(share.sum())]] += 1
    out = [0] * B
    for b, n in zip(full, share.tolist()):
        out[b] = n
    return out


def lay_out_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, device: torch.device | str,
                layout: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """None: contiguous tensors; "qkv": views into one fused [T, (Hq + 2 Hk) * D] projection output,
    as the engine's model hands them over (token stride (Hq + 2 Hk) * D)."""
    to = dict(dtype=dtype, device=device)
    if layout is None:
        return q.to(**to), k.to(**to), v.to(**to)
    t, hq, d = q.shape
    hk = k.shape[1]
    buf = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1).to(**to)
    return (buf[:, : hq * d].view(t, hq, d), buf[:, hq * d: (hq + hk) * d].view(t, hk, d),
            buf[:, (hq + hk) * d:].view(t, hk, d))


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """Ragged requests: `tokens` new tokens in all (one request has a single one when batch > 1),
    `batch * prefix` prefix tokens in all (about a third of the requests have none), the prefix
    slots scattered in shuffled order over a larger pool; k has outlier channels (as post-RoPE
    keys do), so softmax is peaked. Variants: "sm_scale": "seeded" (log-uniform in [0.01, 1]);
    "scale" (q and k times it; 1e-3: near-uniform softmax); "logits": "large" (q, k rounded to
    integers of std ~10: logits in the hundreds, exact in any dtype and summation order);
    "prefix": "empty" (every kv_indptr entry 0: plain causal prefill; kv_indices keeps its slots,
    an unused tail); "lengths": "empty" (a third of the requests get no new tokens, `empty_some`);
    "zero_rows" (a third of the (token, head) query rows all zero); "layout": "qkv" (`lay_out_qkv`)."""
    v = variant_of("extend_attention", variant, {
        "sm_scale": ("seeded",), "scale": float, "logits": ("large",), "prefix": ("empty",),
        "lengths": ("empty",), "zero_rows": (True,), "layout": ("qkv",)})
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, T, P, Hq, Hk, D = (shape[k] for k in ("batch", "tokens", "prefix", "q_heads", "kv_heads", "head_dim"))
    new = new_lengths(B, T, g)
    prefixes = prefix_lengths(new, P, g)
    total = B * P
    num_slots = total + total // 2 + 16
    kv_indices = torch.randperm(num_slots, generator=g)[:total]
    outliers = torch.randperm(D, generator=g)[: max(1, D // 32)]
    q = torch.randn(T, Hq, D, generator=g)
    q[..., outliers] *= 2.0
    k = torch.randn(T, Hk, D, generator=g)
    k[..., outliers] *= 6.0
    v_new = torch.randn(T, Hk, D, generator=g)
    k_buffer = torch.randn(num_slots, Hk, D, generator=g)
    k_buffer[..., outliers] *= 6.0
    v_buffer = torch.randn(num_slots, Hk, D, generator=g)
    sm_scale = 1.0 / math.sqrt(D)
    if v.get("sm_scale") == "seeded":
        sm_scale = log_uniform(g, 0.01, 1.0)
    if "scale" in v:
        q, k, k_buffer = q * v["scale"], k * v["scale"], k_buffer * v["scale"]
    if v.get("logits") == "large":  # exact in bf16 too
        q, k, k_buffer = ((x * 10).round().clamp(-256, 256) for x in (q, k, k_buffer))
    if v.get("prefix") == "empty":
        prefixes = [0] * B
    if v.get("lengths") == "empty":
        new = empty_some(new, g)
    if v.get("zero_rows"):
        q.view(-1, D)[some_rows(g, T * Hq)] = 0.0
    qo_indptr = torch.tensor([0] + new).cumsum(0).to(torch.int32)
    kv_indptr = torch.tensor([0] + prefixes).cumsum(0).to(torch.int32)
    q, k, v_new = lay_out_qkv(q, k, v_new, dtype, device, v.get("layout"))
    to = dict(dtype=dtype, device=device)
    return (q, k, v_new, k_buffer.to(**to), v_buffer.to(**to), qo_indptr.to(device), kv_indptr.to(device),
            kv_indices.to(device), sm_scale)


def shape_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
             qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             sm_scale: float) -> dict[str, int]:
    """`prefix` is per request, from kv_indices' length (no sync): an upper bound when it has a tail."""
    B = qo_indptr.shape[0] - 1
    return {"batch": B, "tokens": q.shape[0], "prefix": triton.cdiv(kv_indices.numel(), max(B, 1)),
            "q_heads": q.shape[1], "kv_heads": k.shape[1], "head_dim": q.shape[2]}


def dispatch_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 sm_scale: float) -> tuple:
    B = qo_indptr.shape[0] - 1
    prefix = -(-kv_indices.numel() // max(B, 1))
    return (q.dtype, q.shape[1], k.shape[1], q.shape[2], size_class(B), size_class(q.shape[0]), size_class(prefix))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    """Bytes: q, o, the new k, v, each request's prefix K/V once per kv head, the indices. FLOPs:
    4 * Hq * D per (query, visible key) pair, with the new tokens split evenly over the requests:
    sum over requests of new * prefix + new * (new + 1) / 2."""
    B, T, P, Hq, Hk, D = (shape[k] for k in ("batch", "tokens", "prefix", "q_heads", "kv_heads", "head_dim"))
    es = dtype.itemsize
    moved = 2 * T * Hq * D * es + 2 * T * Hk * D * es + 2 * B * P * Hk * D * es + B * P * 8 + 2 * (B + 1) * 4
    pairs = T * P + T * (T + max(B, 1)) // (2 * max(B, 1))
    return Cost(bytes=moved, flops=4 * Hq * D * pairs)


# Outputs are convex combinations of v (|o| <= max |v| ~ 4). fp32: accumulation order only (ieee
# dots). fp16/bf16: the reference rounds the same float32 result once, so a 1-ulp flip is the gap
# (rtol); and the kernel rounds each probability to the input dtype before the second dot, as
# flash kernels do: up to half an ulp of p times max |v|, 2^-11 * 4 in fp16, 2^-9 * 4 in bf16 (atol;
# measured: a heavy tail, 15 standard deviations out at 6e4 elements, 2.8e-3 in bf16).
TOLERANCES = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=2e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=8e-3, rtol=1.6e-2),
}

SPEC = OpSpec(
    name="extend_attention",
    signature="extend_attention(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale) -> o",
    summary=(
        "Causal GQA prefill over a paged (page size 1) KV pool: q, o [T, Hq, D] and k, v [T, Hk, D] are the "
        "new tokens, request b's rows qo_indptr[b]:qo_indptr[b+1]; its cached prefix is slots "
        "kv_indices[kv_indptr[b]:kv_indptr[b+1]] of k_buffer, v_buffer [slots, Hk, D] (indptrs int32 [B+1], "
        "kv_indices int64). New token i sees the whole prefix and new tokens 0..i; query head h uses kv head "
        "h // (Hq / Hk); o = softmax(sm_scale * q K^T) V, float32 accumulation."
    ),
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=tuple(
        {"batch": b, "tokens": t, "prefix": p, "q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim}
        for m in MODELS for t in PREFILL_TOKENS for p in PREFILL_PREFIXES for b in PREFILL_BATCHES
    ),
    test_shapes=(
        {"batch": 1, "tokens": 19, "prefix": 0, "q_heads": 4, "kv_heads": 4, "head_dim": 32},
        {"batch": 3, "tokens": 40, "prefix": 24, "q_heads": 8, "kv_heads": 2, "head_dim": 64},
        {"batch": 4, "tokens": 21, "prefix": 17, "q_heads": 6, "kv_heads": 2, "head_dim": 48},
        {"batch": 2, "tokens": 33, "prefix": 35, "q_heads": 4, "kv_heads": 1, "head_dim": 80},
    ),
    bucketed=frozenset({"batch", "tokens", "prefix"}),
    tolerances=TOLERANCES,
    tf32=False,  # float32 is ieee: the float32 tolerance fails a TF32 kernel
    held_back=({"batch": 1, "tokens": 1, "prefix": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 16},
               {"batch": 5, "tokens": 37, "prefix": 13, "q_heads": 3, "kv_heads": 1, "head_dim": 40}),
    variants=({"sm_scale": "seeded"}, {"logits": "large"}, {"scale": 1e-3}, {"prefix": "empty"},
              {"lengths": "empty"}, {"zero_rows": True}, {"layout": "qkv"}),
    # Few programs (the interpreter's cost), GQA, a request longer than one 16-token tile.
    variant_shapes=({"batch": 3, "tokens": 30, "prefix": 12, "q_heads": 4, "kv_heads": 2, "head_dim": 32},),
    many_rows={"batch": 24, "tokens": 48, "prefix": 2, "q_heads": 1, "kv_heads": 1, "head_dim": 16},
    # Real head layouts (llama-3-8b, SmolLM2) at short lengths, a prefix of 4096 at few requests (batch
    # 2: one has it all), and a full token budget over many short requests.
    range_shapes=({"batch": 1, "tokens": 5, "prefix": 16, "q_heads": 32, "kv_heads": 8, "head_dim": 128},
                  {"batch": 2, "tokens": 9, "prefix": 7, "q_heads": 9, "kv_heads": 3, "head_dim": 64},
                  {"batch": 2, "tokens": 5, "prefix": 2048, "q_heads": 2, "kv_heads": 1, "head_dim": 16},
                  {"batch": 64, "tokens": TOKEN_BUDGET, "prefix": 1, "q_heads": 1, "kv_heads": 1, "head_dim": 16}),
)
