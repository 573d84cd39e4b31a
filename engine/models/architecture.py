"""What a model family declares (`Architecture`), and the Hugging Face weight layout the Llama-like ones share.

A module of `engine/models/` that exports `ARCHITECTURE: Architecture` serves the Hugging Face
`architectures` names it lists; `engine/models/__init__.py` finds it by that convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.config import ModelConfig
from kernelloop.engine.memory import KVPool
from kernelloop.engine.models.decoder import DecoderModel
from kernelloop.kernels.dispatch import Dispatcher

# Checkpoint tensor name -> (engine parameter name as `parameters()` names it, its rows that tensor fills;
# None: the whole parameter).
TensorMap = dict[str, tuple[str, slice | None]]


class Model(Protocol):
    """What the engine needs of a model: its config, device and dtype, the forward, the named parameters, and
    the projections by scope (`layers[i].qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`; `lm_head`), where
    quantization finds their shapes."""

    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    layers: list[Any]
    lm_head: torch.Tensor

    def forward(self, batch: ForwardBatch, pool: KVPool, kd: Dispatcher) -> torch.Tensor: ...

    def parameters(self) -> dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class Architecture:
    """One model family, as a module of `engine/models/` declares it.

    `names`: the Hugging Face `architectures` entries served; `model_type`: config.json's `model_type`;
    `config(d, where)`: config.json's dict -> `ModelConfig`, raising `ModelLoadError` (one line that
    starts with `where`) for what the engine would compute wrongly; `tensors(config)`: every tensor a
    checkpoint must provide -> where it goes; `model(config, dtype, device)`: the empty model.
    """

    names: tuple[str, ...]
    model_type: str
    config: Callable[[dict[str, Any], str], ModelConfig]
    tensors: Callable[[ModelConfig], TensorMap]
    model: Callable[[ModelConfig, torch.dtype, str | torch.device], Model] = DecoderModel


def decoder_tensors(c: ModelConfig) -> TensorMap:
    """Hugging Face's Llama layout (separate q/k/v and gate/up), plus q/k/v/o biases and q/k norms as
    `c` has them, into the engine's fused parameters."""
    q, kv, i = c.q_size, c.kv_size, c.intermediate_size
    names: TensorMap = {"model.embed_tokens.weight": ("embed_tokens", None), "model.norm.weight": ("norm", None)}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = ("lm_head", None)
    qkv_rows = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
    for n in range(c.num_layers):
        at, to = f"model.layers.{n}.", f"layers.{n}."
        for part, rows in qkv_rows.items():
            names[f"{at}self_attn.{part}.weight"] = (to + "qkv_proj", rows)
            if c.qkv_bias:
                names[f"{at}self_attn.{part}.bias"] = (to + "qkv_bias", rows)
        names[f"{at}self_attn.o_proj.weight"] = (to + "o_proj", None)
        if c.o_bias:
            names[f"{at}self_attn.o_proj.bias"] = (to + "o_bias", None)
        if c.qk_norm:
            names[f"{at}self_attn.q_norm.weight"] = (to + "q_norm", None)
            names[f"{at}self_attn.k_norm.weight"] = (to + "k_norm", None)
        names[f"{at}mlp.gate_proj.weight"] = (to + "gate_up_proj", slice(0, i))
        names[f"{at}mlp.up_proj.weight"] = (to + "gate_up_proj", slice(i, 2 * i))
        names[f"{at}mlp.down_proj.weight"] = (to + "down_proj", None)
        names[f"{at}input_layernorm.weight"] = (to + "input_norm", None)
        names[f"{at}post_attention_layernorm.weight"] = (to + "post_attention_norm", None)
    return names
