"""Configuration: the model's (read from config.json) and the engine's (typed, frozen)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelloop.engine.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
SUPPORTED_MODEL_TYPES = ("llama",)  # a missing model_type is taken as llama
SUPPORTED_ACTIVATIONS = ("silu",)  # the MLP is silu(gate) * up; a missing hidden_act is taken as silu


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
    """The Llama-family architecture facts the engine needs, from a Hugging Face config.json."""

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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, path: Path) -> "ModelConfig":
        file = Path(path) / "config.json"
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{path} is not a model directory (no config.json)") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{file} is unreadable ({exc})") from None
        return cls.from_dict(data, str(file))

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config.json") -> "ModelConfig":
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise ModelLoadError(f"{where}: architecture {archs} is not supported (only {', '.join(SUPPORTED_ARCHITECTURES)})")
        model_type = d.get("model_type")
        if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(f"{where}: model_type {model_type!r} is not supported (only {', '.join(SUPPORTED_MODEL_TYPES)})")
        act = d.get("hidden_act")
        if act is not None and act not in SUPPORTED_ACTIVATIONS:
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported (only {', '.join(SUPPORTED_ACTIVATIONS)})")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ModelLoadError(f"{where}: attention or MLP biases are not supported")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            config = cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                rope=_rope_config(d),
                torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{where}: missing or malformed field ({type(exc).__name__}: {exc})") from None
        if config.num_heads % config.num_kv_heads:
            raise ModelLoadError(f"{where}: {config.num_heads} heads are not a multiple of {config.num_kv_heads} kv heads")
        return config


def _rope_config(d: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs `rope_theta` + `rope_scaling`.
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = float(d.get("rope_theta") or params.get("rope_theta") or 10000.0)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind != "llama3":
        raise ModelLoadError(f"rope type {kind!r} is not supported (default or llama3)")
    return RopeConfig(
        theta=theta, kind="llama3", factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, model: ModelConfig, device: str) -> torch.dtype:
    """`auto`: float32 on CPU (the reference ops' home), the checkpoint's dtype on a GPU."""
    if name == "auto":
        if torch.device(device).type == "cpu":
            return torch.float32
        return DTYPES.get(model.torch_dtype, torch.bfloat16)
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected auto, {', '.join(DTYPES)}") from None
