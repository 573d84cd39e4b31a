"""Where kernels run: the Device value, Triton's mode (compiled on CUDA, interpreted on CPU), fingerprints.

`configure_triton()` must run before any `@triton.jit` is executed, because Triton decides at
decoration time whether a kernel is compiled or interpreted; loading the op table
(kernelloop.kernels.ops) and the registry's loader call it. This module imports torch only inside its
functions, so command-line parsing can use DEVICES without loading torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import torch

CPU_INTERPRETER = "cpu-interpreter"

# A device kind as records keep it (registry entries, verdicts, profiles, history rows): `cpu-interpreter`
# or a GPU's name and compute capability, e.g. "NVIDIA H200 sm90". Code that acts on a device takes a Device.
Fingerprint = str


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


def default_device() -> Device:
    import torch

    return CUDA if torch.cuda.is_available() and not triton_interpreted() else CPU


@dataclass(frozen=True)
class Device:
    """A kind of device kernels run on, with every decision that depends on the kind. Names are
    resolved into one at the edge (`resolve_device`, `Device.of`); wire formats and stored rows keep
    `kind` or `fingerprint` as strings. A second GPU vendor is one more value in DEVICES."""

    kind: str                # torch's device type
    interpreted: bool        # Triton runs through its interpreter on the CPU, else compiled for the device
    timer: str               # how calls are timed: "cpu-wall" or "cuda-events"
    judge_timeout_s: float   # seconds per candidate in the sandbox when the caller sets none
    matmul_size: int         # side of the square matmul timed for the roofline's compute peak
    copy_bytes: int          # buffer copied to measure the roofline's bandwidth

    def __str__(self) -> str:
        return self.kind

    @property
    def torch(self) -> torch.device:
        import torch

        return torch.device(self.kind)

    @property
    def fingerprint(self) -> Fingerprint:
        """Registry key: `cpu-interpreter`, or the GPU's name and compute capability."""
        return _fingerprint(self.kind)

    def synchronize(self) -> None:
        """Wait for the work queued on the device (nothing to wait for on the CPU)."""
        if not self.interpreted:
            import torch

            torch.cuda.synchronize()

    @staticmethod
    def of(device: DeviceLike) -> Device:
        """The Device of a name ("cpu", "cuda:0"), a torch.device or a Device."""
        if isinstance(device, Device):
            return device
        import torch

        kind = torch.device(device).type
        if kind not in DEVICES:
            raise ValueError(f"unsupported device {device!r}: kernelloop runs on cpu (interpreter) or cuda")
        return DEVICES[kind]


DeviceLike = Union[Device, str, "torch.device"]

# Judge timeouts. CPU: on a busy 2-core box every op's baseline judged as a candidate takes under 40%
# of it. CUDA: compiled kernels are ~1000x faster than the interpreter; what remains is the judge's
# own CPU work and Triton's compiles, which bench/sandbox_gpu.py fits in 60 s for one dtype.
CPU = Device("cpu", interpreted=True, timer="cpu-wall", judge_timeout_s=180.0, matmul_size=1024,
             copy_bytes=256 << 20)
CUDA = Device("cuda", interpreted=False, timer="cuda-events", judge_timeout_s=120.0, matmul_size=8192,
              copy_bytes=1 << 30)
DEVICES: dict[str, Device] = {d.kind: d for d in (CPU, CUDA)}


@lru_cache(maxsize=None)
def _fingerprint(kind: str) -> str:
    if kind == "cpu":
        return CPU_INTERPRETER
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} sm{major}{minor}"


def resolve_device(requested: str | None) -> Device:
    """The device a command runs on: `requested`, else `default_device()`. A device that is not here
    is one line for the user (KernelloopError), not a traceback from deep inside torch."""
    import torch

    from kernelloop.common.errors import KernelloopError

    if requested is None:
        return default_device()
    if requested not in DEVICES:
        raise KernelloopError(f"unknown device {requested!r}: kernelloop runs on cpu (Triton's interpreter) or cuda")
    device = DEVICES[requested]
    if not device.interpreted and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise KernelloopError(f"--device {device}: no CUDA device is visible here (torch {torch.__version__}, "
                              f"{build}); use --device cpu")
    if not device.interpreted and triton_interpreted():
        raise KernelloopError(f"--device {device}: TRITON_INTERPRET is set, so Triton kernels run on the CPU; unset it")
    return device


def device_fingerprint(device: DeviceLike) -> str:
    """Registry key of a device: `cpu-interpreter`, or the GPU's name and compute capability.

    Measurements made through the interpreter never select GPU kernels, and vice versa,
    because their fingerprints differ.
    """
    return Device.of(device).fingerprint
