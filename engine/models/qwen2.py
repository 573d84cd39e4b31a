"""Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): Llama's decoder with q/k/v biases (none on o_proj).

transformers uses `sliding_window` only with `use_sliding_window`, on the layers `layer_types` marks
`sliding_attention` (else those from `max_window_layers` on); the engine serves a model whose window,
where used, hides no token.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.models.architecture import Architecture, decoder_tensors
from kernelloop.engine.models.hf_config import decoder_config, refuse_sliding_window

DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False,
                            "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}


def config(d: dict[str, Any], where: str) -> ModelConfig:
    """config.json -> ModelConfig with q/k/v biases; a sliding window in use is refused as Mistral's is."""
    c = decoder_config(d, where, DEFAULTS)
    refuse_sliding_window(window_in_use({**DEFAULTS, **d}, c.num_layers), c, where)
    return dataclasses.replace(c, qkv_bias=True)


def window_in_use(d: dict[str, Any], num_layers: int) -> Any:
    """The sliding window some layer attends through, or None (Qwen2's and Qwen3's rule)."""
    if not d.get("use_sliding_window") or d.get("sliding_window") is None:
        return None
    kinds = d.get("layer_types") or ["sliding_attention" if i >= int(d["max_window_layers"]) else "full_attention"
                                     for i in range(num_layers)]
    return d["sliding_window"] if "sliding_attention" in kinds else None


ARCHITECTURE = Architecture(names=("Qwen2ForCausalLM",), model_type="qwen2", config=config,
                            tensors=decoder_tensors)
