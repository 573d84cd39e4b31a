"""Mistral (`MistralForCausalLM`): Llama's decoder; served when its sliding window hides no token.

transformers applies `sliding_window` (default 4096) to every layer; the engine attends over the
whole context, so only a window of null or at least max_position_embeddings is accepted.
"""

from __future__ import annotations

from typing import Any

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.models.architecture import Architecture, decoder_tensors
from kernelloop.engine.models.hf_config import decoder_config, refuse_sliding_window

DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
                            "sliding_window": 4096}


def config(d: dict[str, Any], where: str) -> ModelConfig:
    """config.json -> ModelConfig; a sliding window shorter than the positions is refused."""
    c = decoder_config(d, where, DEFAULTS)
    refuse_sliding_window({**DEFAULTS, **d}.get("sliding_window"), c, where)
    return c


ARCHITECTURE = Architecture(names=("MistralForCausalLM",), model_type="mistral", config=config,
                            tensors=decoder_tensors)
