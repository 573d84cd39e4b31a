"""The model families the engine serves, discovered: every module of this package that exports
`ARCHITECTURE: Architecture` serves the Hugging Face `architectures` names it lists.

Adding a family is one module here (docs/ARCHITECTURE.md, "Adding a model"): its names and
model_type, its config.json mapping and its checkpoint-name mapping; the shared decoder
(`decoder.py`) serves it, or its own `model`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

import torch

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.models.architecture import Architecture, Model, TensorMap

DEFAULT_ARCHITECTURE = "LlamaForCausalLM"  # a config.json naming neither architectures nor model_type


def discover() -> dict[str, Architecture]:
    """Every `ARCHITECTURE` of this package, by Hugging Face name (sorted); a name claimed twice is an error."""
    found: dict[str, Architecture] = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        arch = getattr(importlib.import_module(info.name), "ARCHITECTURE", None)
        if not isinstance(arch, Architecture):
            continue
        for name in arch.names:
            if name in found and found[name] is not arch:
                raise ModelLoadError(f"architecture {name} is declared twice (second in {info.name})")
            found[name] = arch
    return dict(sorted(found.items()))


ARCHITECTURES: dict[str, Architecture] = discover()


def architecture_of(d: dict[str, Any], where: str = "config.json") -> str:
    """The served name of a config.json dict: its first supported `architectures` entry; without
    `architectures`, the family of its `model_type` (neither: Llama). A refusal is one line naming what is
    supported."""
    names = d.get("architectures") or []
    names = [names] if isinstance(names, str) else list(names)
    model_type = d.get("model_type")
    if names:
        name = next((n for n in names if n in ARCHITECTURES), None)
        if name is None:
            raise ModelLoadError(f"{where}: architecture {', '.join(map(str, names))} is not supported "
                                 f"(supported: {', '.join(ARCHITECTURES)})")
    elif model_type is None:
        name = DEFAULT_ARCHITECTURE
    else:
        by_type = {a.model_type: n for n, a in ARCHITECTURES.items()}
        if model_type not in by_type:
            raise ModelLoadError(f"{where}: model_type {model_type!r} is not supported "
                                 f"(supported: {', '.join(sorted(by_type))})")
        name = by_type[model_type]
    expected = ARCHITECTURES[name].model_type
    if model_type is not None and model_type != expected:
        raise ModelLoadError(f"{where}: model_type {model_type!r} is not supported for {name} (only {expected})")
    return name


def model_config(d: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """config.json's dict -> ModelConfig through its family's mapping; a refusal is one `ModelLoadError` line."""
    name = architecture_of(d, where)
    try:
        return dataclasses.replace(ARCHITECTURES[name].config(d, where), architecture=name)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: missing or malformed field ({type(exc).__name__}: {exc})") from None


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of the model directory `path` (its config.json)."""
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is not a model directory (no config.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{file} is unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{file} is not a JSON object")
    return model_config(data, str(file))


def family(config: ModelConfig) -> Architecture:
    """The family that serves `config` (read by `model_config`)."""
    return ARCHITECTURES[config.architecture]


def build_model(config: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> Model:
    """The empty model of `config`'s family; `engine.weights` fills it."""
    return family(config).model(config, dtype, device)


def tensor_map(config: ModelConfig) -> TensorMap:
    """Every tensor a checkpoint of `config` must provide -> the engine parameter (and rows) it fills."""
    return family(config).tensors(config)


__all__ = ["ARCHITECTURES", "Architecture", "Model", "TensorMap", "architecture_of", "build_model", "family",
           "model_config", "read_config", "tensor_map"]
