"""Loading Hugging Face safetensors (single file or sharded) straight into the engine's layout.

Tensors are read one at a time and copied into their slice of the engine's (fused) parameters,
so peak memory is the model plus one checkpoint tensor, never a second copy of the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.models import Model, tensor_map

_IGNORED = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"{index} is unreadable ({exc})") from None
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise ModelLoadError(f"{model_dir} has no model.safetensors or model.safetensors.index.json")


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as exc:  # missing shard, corrupt header
            raise ModelLoadError(f"cannot read {file} ({exc})") from None


def load_weights(model: Model, model_dir: Path) -> None:
    """Fill every parameter of `model` from the checkpoint, as its family's `tensor_map` places each tensor;
    refuse a missing, unexpected or misshapen tensor."""
    where = tensor_map(model.config)
    params = model.parameters()
    filled: set[str] = set()
    for name, tensor in iter_tensors(checkpoint_files(model_dir)):
        if name.endswith(_IGNORED):
            continue
        if name not in where:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue  # tied: lm_head is the embedding
            raise ModelLoadError(f"unexpected tensor {name} in {model_dir}")
        param, rows = where[name]
        dest = params[param] if rows is None else params[param][rows]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)} in the checkpoint, {tuple(dest.shape)} expected")
        dest.copy_(tensor)
        filled.add(name)
    missing = [n for n in where if n not in filled]
    if missing:
        raise ModelLoadError(f"{model_dir} lacks {len(missing)} tensors, e.g. {missing[0]}")


@torch.no_grad()
def init_random_weights(model: Model, seed: int = 0) -> None:
    """Seeded random weights at a realistic scale (benchmarks of model shapes without a checkpoint)."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    for name, tensor in model.parameters().items():
        # Drawn in float32 and then rounded, so a bf16 engine and its float32 reference (the gate's
        # ground truth) hold the same weights up to rounding.
        values = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
        if name.endswith("_bias"):
            values.normal_(0.0, 0.02, generator=g)
        elif tensor.dim() == 1:  # norm weights
            values.normal_(1.0, 0.1, generator=g)
        else:
            values.normal_(0.0, tensor.shape[1] ** -0.5, generator=g)
        tensor.copy_(values)
