"""Where kernels run: Triton's mode (compiled on CUDA, interpreted on CPU) and device fingerprints.

`configure_triton()` must run before any `@triton.jit` is executed, because Triton decides at
decoration time whether a kernel is compiled or interpreted; loading the op table
(kernelloop.kernels.ops) and the registry's loader call it. This module imports torch only inside its
functions, so command-line parsing can use DEVICES without loading torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CPU_INTERPRETER = "cpu-interpreter"


def configure_triton() -> None:
    """Use the Triton interpreter when there is no CUDA device, unless the user chose already;
    when interpreting, patch it to compute as compiled Triton does (kernels/interpreter_fidelity.py)."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if triton_interpreted():
        from kernelloop.kernels.interpreter_fidelity import patch_interpreter  # GPU semantics on CPU

        patch_interpreter()


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not triton_interpreted() else "cpu"


DEVICES = ("cpu", "cuda")


def resolve_device(requested: str | None) -> str:
    """The device a command runs on: `requested`, else `default_device()`. A device that is not here
    is one line for the user (KernelloopError), not a traceback from deep inside torch."""
    import torch

    from kernelloop.common.errors import KernelloopError

    if requested is None:
        return default_device()
    if requested not in DEVICES:
        raise KernelloopError(f"unknown device {requested!r}: kernelloop runs on cpu (Triton's interpreter) or cuda")
    if requested == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise KernelloopError(f"--device cuda: no CUDA device is visible here (torch {torch.__version__}, {build}); "
                              "use --device cpu")
    if requested == "cuda" and triton_interpreted():
        raise KernelloopError("--device cuda: TRITON_INTERPRET is set, so Triton kernels run on the CPU; unset it")
    return requested


def device_fingerprint(device: str | torch.device) -> str:
    """Registry key of a device: `cpu-interpreter`, or the GPU's name and compute capability.

    Measurements made through the interpreter never select GPU kernels, and vice versa,
    because their fingerprints differ.
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return CPU_INTERPRETER
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"{torch.cuda.get_device_name(dev)} sm{major}{minor}"
    raise ValueError(f"unsupported device {device!r}: kernelloop runs on cpu (interpreter) or cuda")
