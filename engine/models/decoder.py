"""The decoder every served architecture shares, in the engine's layout: fused qkv and gate_up projections.

Every op of the forward but the embedding lookup (linear for each projection, rmsnorm,
fused_add_rmsnorm, rope, silu_mul, extend_attention, decode_attention) goes through the kernels
Dispatcher, so a registry change reaches the model at the next `reload()`. Each projection is called by its
scope (`linear_at`, named as `parameters()` names it), so a quantization selection reaches the layers it chose.
Where an architecture departs from Llama (q/k/v and o biases, per-head q/k norms), `ModelConfig`'s flags
add the parameters and the op calls; without them the forward is Llama's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelloop.engine.attention import attention
from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.config import ModelConfig
from kernelloop.engine.memory import KVPool
from kernelloop.engine.rotary import cos_sin_cache
from kernelloop.kernels.dispatch import Dispatcher


class DecoderLayer:
    """One layer's tensors; an optional one is None when the architecture has none."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: str | torch.device):
        h, i = config.hidden_size, config.intermediate_size
        qkv = config.q_size + 2 * config.kv_size

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        self.input_norm = empty(h)
        self.qkv_proj = empty(qkv, h)  # rows: q, then k, then v
        self.qkv_bias = empty(qkv) if config.qkv_bias else None
        self.q_norm = empty(config.head_dim) if config.qk_norm else None
        self.k_norm = empty(config.head_dim) if config.qk_norm else None
        self.o_proj = empty(h, config.q_size)
        self.o_bias = empty(h) if config.o_bias else None
        self.post_attention_norm = empty(h)
        self.gate_up_proj = empty(2 * i, h)  # rows: gate, then up
        self.down_proj = empty(h, i)


class DecoderModel:
    """Weights plus the forward pass; `engine.weights.load_weights` fills the weights."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: str | torch.device):
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.embed_tokens = torch.empty(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = [DecoderLayer(config, dtype, device) for _ in range(config.num_layers)]
        self.norm = torch.empty(config.hidden_size, dtype=dtype, device=device)
        self.lm_head = (self.embed_tokens if config.tie_word_embeddings
                        else torch.empty(config.vocab_size, config.hidden_size, dtype=dtype, device=device))
        self.cos_sin_cache = cos_sin_cache(config.rope, config.head_dim, config.max_position_embeddings, device)
        self.scale = config.head_dim ** -0.5

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool, kd: Dispatcher) -> torch.Tensor:
        """Logits [B, vocab] (float32) at each request's last new token."""
        c = self.config
        eps = c.rms_norm_eps
        hidden = F.embedding(batch.input_ids, self.embed_tokens)
        residual = None
        for index, layer in enumerate(self.layers):
            if residual is None:
                residual = hidden
                hidden = kd.rmsnorm(hidden, layer.input_norm, eps)
            else:
                hidden, residual = kd.fused_add_rmsnorm(hidden, residual, layer.input_norm, eps)
            qkv = kd.linear_at(f"layers.{index}.qkv_proj", hidden, layer.qkv_proj, layer.qkv_bias)
            t = qkv.shape[0]
            q = qkv[:, :c.q_size].view(t, c.num_heads, c.head_dim)
            k = qkv[:, c.q_size:c.q_size + c.kv_size].view(t, c.num_kv_heads, c.head_dim)
            v = qkv[:, c.q_size + c.kv_size:].view(t, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None:  # per head: the op normalizes the last dim of [t, heads, head_dim]
                q = kd.rmsnorm(q, layer.q_norm, eps)
                k = kd.rmsnorm(k, layer.k_norm, eps)
            q, k = kd.rope(q, k, batch.positions, self.cos_sin_cache)
            o = attention(q, k, v, index, batch, pool, kd, self.scale)
            hidden = kd.linear_at(f"layers.{index}.o_proj", o.reshape(t, c.q_size), layer.o_proj, layer.o_bias)
            hidden, residual = kd.fused_add_rmsnorm(hidden, residual, layer.post_attention_norm, eps)
            gate_up = kd.linear_at(f"layers.{index}.gate_up_proj", hidden, layer.gate_up_proj, None)
            hidden = kd.linear_at(f"layers.{index}.down_proj", kd.silu_mul(gate_up), layer.down_proj, None)
        last = batch.last_token_index
        hidden, _ = kd.fused_add_rmsnorm(hidden[last], residual[last], self.norm, eps)
        return kd.linear_at("lm_head", hidden, self.lm_head, None).float()

    def parameters(self) -> dict[str, torch.Tensor]:
        """Engine-layout name -> tensor (tied lm_head appears once; absent optional tensors not at all)."""
        params = {"embed_tokens": self.embed_tokens, "norm": self.norm}
        if not self.config.tie_word_embeddings:
            params["lm_head"] = self.lm_head
        for i, layer in enumerate(self.layers):
            for name, value in vars(layer).items():
                if value is not None:
                    params[f"layers.{i}.{name}"] = value
        return params
