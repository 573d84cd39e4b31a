"""Configuration values: the model's (typed, frozen; read from config.json by `engine.models`) and the dtype."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernelloop.kernels.device import Device


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """The decoder facts the engine needs; `engine.models.read_config` maps a Hugging Face config.json here.

    The flags say how an architecture departs from Llama's decoder: `qkv_bias` (q/k/v projections have
    biases, Qwen2), `o_bias` (the output projection has one), `qk_norm` (per-head RMSNorm of q and k
    before rope, Qwen3)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    torch_dtype: str = "float32"
    architecture: str = "LlamaForCausalLM"  # the Hugging Face architecture name served
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, model: ModelConfig, device: Device) -> torch.dtype:
    """`auto`: float32 on CPU (the reference ops' home), the checkpoint's dtype on a GPU."""
    if name == "auto":
        if device.interpreted:
            return torch.float32
        return DTYPES.get(model.torch_dtype, torch.bfloat16)
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected auto, {', '.join(DTYPES)}") from None
