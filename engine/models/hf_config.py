"""config.json fields the Llama-like families spell alike, read into `ModelConfig`; each family module adds its own."""

from __future__ import annotations

from typing import Any

from kernelloop.engine.config import ModelConfig, RopeConfig
from kernelloop.engine.errors import ModelLoadError

SUPPORTED_ACTIVATIONS = ("silu",)  # the MLP is silu(gate) * up; a missing hidden_act is taken as silu


def decoder_config(d: dict[str, Any], where: str, defaults: dict[str, Any]) -> ModelConfig:
    """The shared fields of `d`; `defaults` fills the keys `d` lacks (the family's transformers defaults).

    Refuses, in one line starting with `where`, an activation other than silu, a malformed field and
    heads that are not a multiple of the kv heads."""
    d = {**defaults, **d}
    act = d.get("hidden_act")
    if act is not None and act not in SUPPORTED_ACTIVATIONS:
        raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported (only {', '.join(SUPPORTED_ACTIVATIONS)})")
    try:
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        config = ModelConfig(
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
            rope=rope_config(d, where),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: missing or malformed field ({type(exc).__name__}: {exc})") from None
    if config.num_heads % config.num_kv_heads:
        raise ModelLoadError(f"{where}: {config.num_heads} heads are not a multiple of {config.num_kv_heads} kv heads")
    return config


def rope_config(d: dict[str, Any], where: str) -> RopeConfig:
    """Default or llama3 rope, from transformers >= 5's `rope_parameters` (theta inside) or the older
    `rope_theta` + `rope_scaling`."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = float(d.get("rope_theta") or params.get("rope_theta") or 10000.0)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind != "llama3":
        raise ModelLoadError(f"{where}: rope type {kind!r} is not supported (default or llama3)")
    return RopeConfig(
        theta=theta, kind="llama3", factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def refuse_sliding_window(window: Any, config: ModelConfig, where: str) -> None:
    """The engine attends over the whole context: a window shorter than the model's positions is refused.
    A window of at least max_position_embeddings never hides a token (the context is at most that long)."""
    if window is not None and int(window) < config.max_position_embeddings:
        raise ModelLoadError(f"{where}: sliding_window {window} is shorter than max_position_embeddings "
                             f"{config.max_position_embeddings}, and the engine has no sliding-window attention")
