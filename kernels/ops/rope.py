"""rope(q, k, positions, cos_sin_cache) -> (q_out, k_out): NeoX-style rotary embedding.

q [T, Hq, D], k [T, Hk, D] (any token/head strides, unit stride along D), positions [T] int64,
cos_sin_cache [max_pos, D] float32: row p = cat(cos(p * inv_freq), sin(p * inv_freq)), each D/2 wide.
With x1 = x[..., :D/2], x2 = x[..., D/2:]: out = cat(x1*cos - x2*sin, x2*cos + x1*sin), in x's dtype.
The cache is float32 whatever the input dtype (the kernel also accepts a half cache, widened on load).
Out-of-place: q_out and k_out are new contiguous tensors.
The spec; the baseline kernel is kernels/ops/rope_kernel.py.
"""

from __future__ import annotations

import torch

from kernelloop.kernels.inputs import some_rows, variant_of
from kernelloop.kernels.models import ENGINE_TOKENS, MODELS
from kernelloop.kernels.ops.rope_kernel import forward
from kernelloop.kernels.spec import DEFAULT_TOLERANCES, TOKEN_BUDGET, Cost, OpSpec, Shape, Variant, size_class

ROPE_THETA = 500000.0  # Llama-3
DEFAULT_MAX_POS = 8192 + 256  # make_inputs' cache length unless the shape gives `max_pos`


def reference(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.float()[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2] each

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def cos_sin_cache_for(max_pos: int, head_dim: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """[max_pos, head_dim] float32: cat(cos, sin) of p * theta^(-2i/head_dim), i < head_dim/2."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def spread_positions(t: int, max_pos: int, g: torch.Generator) -> torch.Tensor:
    """A prefill run ending at the last cached position (the last token keeps it), with a third of
    the other tokens moved to position 0 and a third repeating another token's position."""
    positions = torch.arange(max_pos - t, max_pos, dtype=torch.int64).clamp_min(0)
    positions[some_rows(g, t - 1)] = 0
    repeats = some_rows(g, t - 1)
    positions[repeats] = positions[torch.randint(0, t, (len(repeats),), generator=g)]
    return positions


def lay_out_qk(q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype, device: torch.device | str, layout: str | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] as named: None, contiguous; "qkv", views into one fused
    [T, (Hq + 2 Hk) * D] projection output (the v part NaN); "head_major", [H, T, D] storage
    seen as [T, H, D] (token stride D)."""
    if layout is None:
        return q.to(dtype=dtype, device=device), k.to(dtype=dtype, device=device)
    if layout == "head_major":
        def moved(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1).contiguous().to(dtype=dtype, device=device).transpose(0, 1)

        return moved(q), moved(k)
    t, hq, d = q.shape
    hk = k.shape[1]
    buf = torch.full((t, (hq + 2 * hk) * d), float("nan"))
    buf[:, : hq * d] = q.flatten(1)
    buf[:, hq * d: (hq + hk) * d] = k.flatten(1)
    buf = buf.to(dtype=dtype, device=device)
    return buf[:, : hq * d].view(t, hq, d), buf[:, hq * d: (hq + hk) * d].view(t, hk, d)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """Unit-scale q/k, random positions below max_pos (DEFAULT_MAX_POS unless the shape says).
    Variants: "positions": "spread" (`spread_positions`), "scale" (q and k times it), "layout"
    (`lay_out_qk`)."""
    v = variant_of("rope", variant, {"positions": ("spread",), "scale": float, "layout": ("qkv", "head_major")})
    g = torch.Generator(device="cpu").manual_seed(seed)
    t, hq, hk, d = shape["tokens"], shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    max_pos = shape.get("max_pos", DEFAULT_MAX_POS)
    q = torch.randn(t, hq, d, generator=g)
    k = torch.randn(t, hk, d, generator=g)
    positions = torch.randint(0, max_pos, (t,), generator=g, dtype=torch.int64)
    cache = cos_sin_cache_for(max_pos, d)
    if v.get("positions") == "spread":
        positions = spread_positions(t, max_pos, g)
    if "scale" in v:
        q, k = q * v["scale"], k * v["scale"]
    q, k = lay_out_qk(q, k, dtype, device, v.get("layout"))
    return q, k, positions.to(device=device), cache.to(device=device)


def shape_of(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> dict[str, int]:
    return {"tokens": q.shape[0], "q_heads": q.shape[1], "kv_heads": k.shape[1], "head_dim": q.shape[2]}


def dispatch_key(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple:
    return (q.dtype, q.shape[1], k.shape[1], q.shape[2], size_class(q.shape[0]))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    # q and k read and written once; one int64 position and one float32 cache row per token.
    # FLOPs: two multiplies and one add per output element.
    t, hq, hk, d = shape["tokens"], shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    elems = t * (hq + hk) * d
    return Cost(bytes=2 * elems * dtype.itemsize + t * 8 + t * d * 4, flops=3 * elems)


SPEC = OpSpec(
    name="rope",
    batch_rows=("q", "k", "positions"),
    signature="rope(q, k, positions, cos_sin_cache) -> (q_out, k_out)",
    summary=(
        "NeoX rotary embedding: q [T, Hq, D], k [T, Hk, D], positions [T] int64, cos_sin_cache "
        "[max_pos, D] float32 (cos | sin halves); out = cat(x1*cos - x2*sin, x2*cos + x1*sin). Out-of-place."
    ),
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=tuple(
        {"tokens": t, "q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim}
        for m in MODELS for t in ENGINE_TOKENS
    ),
    test_shapes=(
        {"tokens": 1, "q_heads": 4, "kv_heads": 1, "head_dim": 64},
        {"tokens": 3, "q_heads": 5, "kv_heads": 3, "head_dim": 48},
        {"tokens": 4, "q_heads": 12, "kv_heads": 2, "head_dim": 128},
        {"tokens": 5, "q_heads": 7, "kv_heads": 7, "head_dim": 80},
        {"tokens": 2, "q_heads": 40, "kv_heads": 8, "head_dim": 128},
    ),
    bucketed=frozenset({"tokens"}),
    tolerances=DEFAULT_TOLERANCES,
    num_outputs=2,
    held_back=({"tokens": 1, "q_heads": 1, "kv_heads": 1, "head_dim": 2},
               {"tokens": 7, "q_heads": 6, "kv_heads": 2, "head_dim": 96},
               {"tokens": 3, "q_heads": 3, "kv_heads": 3, "head_dim": 34}),
    variants=({"positions": "spread"}, {"scale": 1e-3}, {"scale": 1e3}, {"layout": "qkv"}, {"layout": "head_major"}),
    variant_shapes=({"tokens": 6, "q_heads": 4, "kv_heads": 2, "head_dim": 64},),
    many_rows={"tokens": 70, "q_heads": 2, "kv_heads": 1, "head_dim": 8},  # ~15 ms a token in the interpreter
    # Real head layouts (SmolLM2, llama-3.2-1b, llama-3-70b) at few tokens; many tokens at one head:
    # on CPU 129 (the 129-1024 bucket's floor), as the baseline takes ~13 ms a token to interpret, in
    # its call and again in its replay (1025 tokens would add ~28 s to every candidate).
    range_shapes=({"tokens": 1, "q_heads": 9, "kv_heads": 3, "head_dim": 64},
                  {"tokens": 2, "q_heads": 32, "kv_heads": 8, "head_dim": 64},
                  {"tokens": 3, "q_heads": 64, "kv_heads": 8, "head_dim": 128},
                  {"tokens": TOKEN_BUDGET, "q_heads": 1, "kv_heads": 1, "head_dim": 8}),
    cpu_range_tokens=129,
)
