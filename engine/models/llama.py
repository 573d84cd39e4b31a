"""Llama (`LlamaForCausalLM`): the decoder as is; `attention_bias` adds q/k/v and o biases."""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.models.architecture import Architecture, decoder_tensors
from kernelloop.engine.models.hf_config import decoder_config

DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False}


def config(d: dict[str, Any], where: str) -> ModelConfig:
    """config.json -> ModelConfig; MLP biases are refused."""
    if d.get("mlp_bias"):
        raise ModelLoadError(f"{where}: MLP biases (mlp_bias) are not supported")
    bias = bool(d.get("attention_bias", False))
    return dataclasses.replace(decoder_config(d, where, DEFAULTS), qkv_bias=bias, o_bias=bias)


ARCHITECTURE = Architecture(names=("LlamaForCausalLM",), model_type="llama", config=config,
                            tensors=decoder_tensors)
