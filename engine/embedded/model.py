"""The embedded model's architecture: a small Llama with a compact functional forward for training.

Parameters live in a plain dict keyed by their Hugging Face names (`model.layers.0.self_attn.q_proj.weight`
...), so export is a straight save. The forward is the Llama math transformers uses: RMSNorm,
rotate-half (NeoX) rope, grouped-query causal attention, SwiGLU MLP, tied LM head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of the embedded model (the vocabulary size comes from the tokenizer)."""

    vocab_size: int
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 3
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    # 8 heads x 32 = 256 != hidden 192 on purpose: the engine must read head_dim, not derive it.
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True

EMBED_STD = 0.08  # above the usual 0.02: with tied embeddings it learns the chat tasks more reliably


def init_params(cfg: ModelConfig, generator: torch.Generator) -> Params:
    """Fresh float32 weights: normal(0, 0.02), output projections scaled by 1/sqrt(2 * layers),
    embeddings normal(0, EMBED_STD), norms 1."""
    std, out_std = 0.02, 0.02 / math.sqrt(2 * cfg.num_hidden_layers)
    h, q, kv, i = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, \
        cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size

    def normal(rows: int, cols: int, s: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * s

    p: Params = {"model.embed_tokens.weight": normal(cfg.vocab_size, h, EMBED_STD)}
    for n in range(cfg.num_hidden_layers):
        pre = f"model.layers.{n}."
        p[pre + "input_layernorm.weight"] = torch.ones(h)
        p[pre + "self_attn.q_proj.weight"] = normal(q, h, std)
        p[pre + "self_attn.k_proj.weight"] = normal(kv, h, std)
        p[pre + "self_attn.v_proj.weight"] = normal(kv, h, std)
        p[pre + "self_attn.o_proj.weight"] = normal(h, q, out_std)
        p[pre + "post_attention_layernorm.weight"] = torch.ones(h)
        p[pre + "mlp.gate_proj.weight"] = normal(i, h, std)
        p[pre + "mlp.up_proj.weight"] = normal(i, h, std)
        p[pre + "mlp.down_proj.weight"] = normal(h, i, out_std)
    p["model.norm.weight"] = torch.ones(h)
    if not cfg.tie_word_embeddings:
        p["lm_head.weight"] = normal(cfg.vocab_size, h, std)
    return p


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(cfg: ModelConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [*positions.shape, head_dim], each half repeated (rotate-half convention)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [batch, heads, seq, head_dim] by position: x*cos + rotate_half(x)*sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def forward(p: Params, cfg: ModelConfig, ids: torch.Tensor, positions: torch.Tensor | None = None,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [batch, seq, vocab] for token ids [batch, seq].

    By default positions are 0..seq-1 and attention is causal; training passes per-document
    `positions` [batch, seq] and a boolean `mask` [batch, 1, seq, seq] (True: may attend).
    """
    b, t = ids.shape
    hq, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if positions is None:
        positions = torch.arange(t).expand(b, t)
    cos, sin = rope_cos_sin(cfg, positions[:, None])  # [batch, 1 (heads), seq, head_dim]
    x = F.embedding(ids, p["model.embed_tokens.weight"])  # deterministic backward, unlike w[ids]
    for n in range(cfg.num_hidden_layers):
        pre = f"model.layers.{n}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(b, t, hq, d).transpose(1, 2)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(b, t, hk, d).transpose(1, 2)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(b, t, hk, d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(b, t, hq * d) @ p[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], cfg.rms_norm_eps)
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    return x @ head.T
