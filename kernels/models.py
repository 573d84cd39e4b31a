"""Dimensions of the Llama-family models whose shapes the op library is tuned and tested for.

Each op derives its `engine_shapes` from these, so adding a model here adds its shapes everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    name: str
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int


MODELS: tuple[ModelDims, ...] = (
    ModelDims("llama-3.2-1b", hidden=2048, intermediate=8192, q_heads=32, kv_heads=8, head_dim=64),
    ModelDims("qwen2.5-1.5b", hidden=1536, intermediate=8960, q_heads=12, kv_heads=2, head_dim=128),
    ModelDims("gpt-oss-20b", hidden=2880, intermediate=2880, q_heads=64, kv_heads=8, head_dim=64),
    ModelDims("llama-3-8b", hidden=4096, intermediate=14336, q_heads=32, kv_heads=8, head_dim=128),
    ModelDims("llama-2-13b", hidden=5120, intermediate=13824, q_heads=40, kv_heads=40, head_dim=128),
    ModelDims("llama-3-70b", hidden=8192, intermediate=28672, q_heads=64, kv_heads=8, head_dim=128),
)

# Tokens per forward pass: decode batches (1..64) and prefill chunks (up to 8192).
DECODE_TOKENS: tuple[int, ...] = (1, 8, 32, 64)
PREFILL_TOKENS: tuple[int, ...] = (512, 2048, 8192)
ENGINE_TOKENS: tuple[int, ...] = DECODE_TOKENS + PREFILL_TOKENS

# Context lengths for decode attention.
DECODE_CONTEXTS: tuple[int, ...] = (512, 4096)
