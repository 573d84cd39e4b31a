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

Baseline: one program per (block of new tokens of one request, kv head), flash-attention style, the
G query heads of the kv head stacked as rows (BLOCK_M rows = BLOCK_M / next_pow2(G) tokens x G heads,
token-major), so each K/V tile is loaded once per group: the prefix tiles (slots gathered through
kv_indices, masked by length only), then the request's earlier new tokens in whole tiles (no mask),
then the rest up to the block's last token (causal mask). float32 online softmax and accumulator;
fp16/bf16 dots take their inputs in their own dtype with p rounded to v's dtype for the second, as
flash kernels do (the fp16/bf16 atol allows for it); float32 dots are full precision (ieee, no TF32).

The grid needs no host sync: with BLOCK_T tokens per block, request b owns the "virtual" blocks
qo_indptr[b] // BLOCK_T + b ... qo_indptr[b+1] // BLOCK_T + b (at least ceil(new_b / BLOCK_T) of
them), so T // BLOCK_T + B blocks cover every request, and a program finds its request by binary
search over qo_indptr; at most about B of them find nothing to do. The launch depends only on T, B,
the heads and the dtype (shapes, never values), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelloop.kernels.models import MODELS, PREFILL_TOKENS
from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.spec import Cost, OpSpec, Shape, Tolerance, Variant, log_uniform, size_class, some_rows, variant_of

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


@triton.jit
def _extend_kernel(q_ptr, k_ptr, v_ptr, o_ptr, kb_ptr, vb_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr,
                   sm_scale, B, search_steps, G, D,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                   stride_kbt, stride_kbh, stride_vbt, stride_vbh,
                   BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   PRECISION: tl.constexpr):
    # Program (virtual block, kv head). Its BLOCK_M rows are BLOCK_T = BLOCK_M // BLOCK_G new tokens of
    # one request times the (up to) BLOCK_G query heads sharing this kv head, token-major: row r is
    # token m0 + r // BLOCK_G, query head kv_head * G + r % BLOCK_G. Each K/V tile is loaded once for
    # the whole group. Blocks run last first: a request's late blocks see the most keys, so the
    # longest programs start first.
    BLOCK_T: tl.constexpr = BLOCK_M // BLOCK_G
    blk = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)

    # Request b owns virtual blocks [qo_indptr[b] // BLOCK_T + b, qo_indptr[b+1] // BLOCK_T + b + 1):
    # binary search for the last b whose first block is <= blk.
    lo = blk * 0
    hi = lo + B
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        first = (tl.load(qo_indptr_ptr + mid) // BLOCK_T + mid).to(tl.int32)
        right = first <= blk
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    b = lo

    q_start = tl.load(qo_indptr_ptr + b).to(tl.int64)
    n_new = tl.load(qo_indptr_ptr + b + 1).to(tl.int64) - q_start
    m0 = (blk - (q_start // BLOCK_T + b)) * BLOCK_T  # first new token (of request b) of this block
    if m0 >= n_new:
        return

    offs_r = tl.arange(0, BLOCK_M)
    offs_g = offs_r % BLOCK_G
    head = kv_head * G + offs_g
    tok = m0 + offs_r // BLOCK_G  # [BLOCK_M] new-token index within the request
    mask_r = (tok < n_new) & (offs_g < G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # 1. The cached prefix: every row sees every token; tiles masked at the prefix's end only.
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    prefix_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start
    for n0 in range(0, prefix_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < prefix_len
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(kb_ptr + slots[:, None] * stride_kbt + kv_head * stride_kbh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))  # finite: every tile has a valid token
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(vb_ptr + slots[:, None] * stride_vbt + kv_head * stride_vbh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    # 2. The request's new tokens in whole tiles before this block: visible to every row, no mask.
    diag = m0 // BLOCK_N * BLOCK_N
    for n0 in range(0, diag, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < n_new)[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    # 3. The rest up to this block's last token, causal: token i sees new tokens j <= i. Every row
    # sees token `diag` (<= m0) in the first tile, so its running max is finite from then on (a
    # later tile may hide a whole row).
    for n0 in range(diag, tl.minimum(m0 + BLOCK_T, n_new), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_new
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        causal = (offs_n[None, :] <= tok[:, None]) & mask_n[None, :]
        qk = tl.where(causal, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])


def launch_config(q: torch.Tensor, kv_heads: int) -> dict[str, int]:
    """Rows, tiles and warps. The interpreter (CPU tensors) gets 16 new tokens per program and
    16-token K/V tiles, so the small test shapes cross tile edges in every loop. A GPU gets tiles
    that fit sm90 without spilling at head_dim 128 (tests/test_extend_attention.py compiles them):
    fp16/bf16 128 x 32 tiles, 8 warps, ~190 registers (128 x 64 needs ~250 with 8 warps, spills
    with 4); fp32 (ieee dots on the FMA units) 64 x 16 tiles, 16 warps, ~90 registers (any 32-key
    tile spills kilobytes)."""
    group = triton.next_power_of_2(q.shape[1] // max(kv_heads, 1))
    if q.device.type == "cpu":
        return {"BLOCK_M": 16 * group, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if q.dtype == torch.float32:
        return {"BLOCK_M": max(64, group), "BLOCK_N": 16, "num_warps": 16, "num_stages": 2}
    return {"BLOCK_M": max(128, group), "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
           qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, sm_scale: float,
           BLOCK_M: int, BLOCK_N: int, num_warps: int = 4, num_stages: int = 1) -> torch.Tensor:
    """The kernel with explicit rows per program (BLOCK_M: powers of two, a multiple of the padded
    group) and K/V tile (BLOCK_N)."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    if Hq % Hk != 0:
        raise ValueError(f"extend_attention: q_heads {Hq} is not a multiple of kv_heads {Hk}")
    G = Hq // Hk
    block_g = triton.next_power_of_2(G)
    if BLOCK_M % block_g or BLOCK_M & (BLOCK_M - 1) or BLOCK_N & (BLOCK_N - 1) or min(BLOCK_M, BLOCK_N) < 16:
        raise ValueError(f"extend_attention: BLOCK_M {BLOCK_M} and BLOCK_N {BLOCK_N} must be powers of two >= 16, "
                         f"BLOCK_M a multiple of the padded group {block_g}")
    B = qo_indptr.shape[0] - 1
    o = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0 or B <= 0:
        return o
    if any(t.stride(-1) != 1 for t in (q, k, v, k_buffer, v_buffer)):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        k_buffer, v_buffer = k_buffer.contiguous(), v_buffer.contiguous()
    # fp16/bf16 operands go to the tensor cores as they are; fp32 needs full-precision dots.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (T // (BLOCK_M // block_g) + B, Hk)
    _extend_kernel[grid](
        q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, B, B.bit_length(), G, D,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_G=block_g, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(D)),
        PRECISION=precision, num_warps=num_warps, num_stages=num_stages,
    )
    return o


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
            qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
            sm_scale: float) -> torch.Tensor:
    config = launch_config(q, k.shape[1])
    return launch(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, **config)


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


def lay_out_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, device: str,
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


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str, variant: Variant | None = None) -> tuple:
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
)
