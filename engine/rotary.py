"""Rotary embedding tables, computed exactly as Hugging Face's Llama does (float32), NeoX layout."""

from __future__ import annotations

import math

import torch

from kernelloop.engine.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """[head_dim / 2] float32, with Llama 3.1's frequency-dependent scaling when configured."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind != "llama3":
        return inv_freq
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(rope: RopeConfig, head_dim: int, max_positions: int, device: str | torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: row p = cat(cos(p * inv_freq), sin(p * inv_freq))."""
    inv_freq = inverse_frequencies(rope, head_dim)
    angles = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
