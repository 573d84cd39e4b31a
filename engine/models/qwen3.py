"""Qwen3 (`Qwen3ForCausalLM`): Llama's decoder with a per-head RMSNorm of q and k before rope.

Both norms use `rms_norm_eps` and run through the `rmsnorm` op on [tokens, heads, head_dim].
`attention_bias` (default false) adds biases to q/k/v and o. head_dim defaults to 128, not
hidden_size / heads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.models.architecture import Architecture, decoder_tensors
from kernelloop.engine.models.hf_config import decoder_config, refuse_sliding_window
from kernelloop.engine.models.qwen2 import window_in_use

DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False,
                            "head_dim": 128, "attention_bias": False, "use_sliding_window": False,
                            "sliding_window": 4096, "max_window_layers": 28}


def config(d: dict[str, Any], where: str) -> ModelConfig:
    """config.json -> ModelConfig with q/k norms (and biases if asked); a sliding window in use is refused."""
    c = decoder_config(d, where, DEFAULTS)
    merged = {**DEFAULTS, **d}
    refuse_sliding_window(window_in_use(merged, c.num_layers), c, where)
    bias = bool(merged["attention_bias"])
    return dataclasses.replace(c, qk_norm=True, qkv_bias=bias, o_bias=bias)


ARCHITECTURE = Architecture(names=("Qwen3ForCausalLM",), model_type="qwen3", config=config,
                            tensors=decoder_tensors)
