"""Where kernels run: Triton's mode (compiled on CUDA, interpreted on CPU) and device fingerprints.

`configure_triton()` must run before any `@triton.jit` is executed, because Triton decides at
decoration time whether a kernel is compiled or interpreted; `import kernels` calls it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CPU_INTERPRETER = "cpu-interpreter"


def configure_triton() -> None:
    """Use the Triton interpreter when there is no CUDA device, unless the user chose already;
    when interpreting, patch it to compute as compiled Triton does (kernels/interpreter_fidelity.py)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if triton_interpreted():
        from kernels.interpreter_fidelity import patch_interpreter  # GPU semantics on CPU

        patch_interpreter()


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() and not triton_interpreted() else "cpu"


def device_fingerprint(device: str | torch.device) -> str:
    """Registry key of a device: `cpu-interpreter`, or the GPU's name and compute capability.

    Measurements made through the interpreter never select GPU kernels, and vice versa,
    because their fingerprints differ.
    """
    dev = torch.device(device)
    if dev.type == "cpu":
        return CPU_INTERPRETER
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"{torch.cuda.get_device_name(dev)} sm{major}{minor}"
    raise ValueError(f"unsupported device {device!r}: kernelloop runs on cpu (interpreter) or cuda")


def cache_root() -> Path:
    """Where kernelloop keeps rebuildable files: $KERNELLOOP_CACHE, else ~/.cache/kernelloop."""
    env = os.environ.get("KERNELLOOP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kernelloop"
