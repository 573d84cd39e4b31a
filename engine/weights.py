"""Loading Hugging Face safetensors (single file or sharded) straight into the engine's layout.

Tensors are read one at a time and copied into their slice of the engine's (fused) parameters,
so peak memory is the model plus one checkpoint tensor, never a second copy of the model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.model import LlamaModel

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")
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


def destination(model: LlamaModel, name: str) -> torch.Tensor | None:
    """The engine tensor (a slice for fused projections) that checkpoint tensor `name` fills."""
    c = model.config
    if name == "model.embed_tokens.weight":
        return model.embed_tokens
    if name == "model.norm.weight":
        return model.norm
    if name == "lm_head.weight":
        return None if c.tie_word_embeddings else model.lm_head
    match = _LAYER.fullmatch(name)
    if not match or int(match.group(1)) >= c.num_layers:
        return None
    layer, part = model.layers[int(match.group(1))], match.group(2)
    q, kv, i = c.q_size, c.kv_size, c.intermediate_size
    slices = {
        "self_attn.q_proj": layer.qkv_proj[:q],
        "self_attn.k_proj": layer.qkv_proj[q:q + kv],
        "self_attn.v_proj": layer.qkv_proj[q + kv:],
        "self_attn.o_proj": layer.o_proj,
        "mlp.gate_proj": layer.gate_up_proj[:i],
        "mlp.up_proj": layer.gate_up_proj[i:],
        "mlp.down_proj": layer.down_proj,
        "input_layernorm": layer.input_norm,
        "post_attention_layernorm": layer.post_attention_norm,
    }
    return slices.get(part)


def load_weights(model: LlamaModel, model_dir: Path) -> None:
    """Fill every parameter of `model` from the checkpoint; refuse a missing or misshapen tensor."""
    filled: set[int] = set()
    for name, tensor in iter_tensors(checkpoint_files(model_dir)):
        if name.endswith(_IGNORED):
            continue
        dest = destination(model, name)
        if dest is None:
            if name == "lm_head.weight":
                continue  # tied: lm_head is the embedding
            raise ModelLoadError(f"unexpected tensor {name} in {model_dir}")
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)} in the checkpoint, {tuple(dest.shape)} expected")
        dest.copy_(tensor)
        filled.add(dest.data_ptr())
    expected = _expected_names(model)
    missing = [n for n, t in expected.items() if t.data_ptr() not in filled]
    if missing:
        raise ModelLoadError(f"{model_dir} lacks {len(missing)} tensors, e.g. {missing[0]}")


def _expected_names(model: LlamaModel) -> dict[str, torch.Tensor]:
    """Checkpoint name -> destination for every tensor the checkpoint must provide."""
    c = model.config
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if c.tie_word_embeddings else ["lm_head.weight"])
    for i in range(c.num_layers):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            names.append(f"model.layers.{i}.{part}.weight")
    return {n: destination(model, n) for n in names}


@torch.no_grad()
def init_random_weights(model: LlamaModel, seed: int = 0) -> None:
    """Seeded random weights at a realistic scale (benchmarks of model shapes without a checkpoint)."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    for name, tensor in model.parameters().items():
        # Drawn in float32 and then rounded, so a bf16 engine and its float32 reference (the gate's
        # ground truth) hold the same weights up to rounding.
        values = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
        if tensor.dim() == 1:  # norm weights
            values.normal_(1.0, 0.1, generator=g)
        else:
            values.normal_(0.0, tensor.shape[1] ** -0.5, generator=g)
        tensor.copy_(values)
