"""The programs a sandboxed process may start: Triton's compiler toolchain on CUDA, nothing on CPU.

On CUDA, Triton starts the bundled ptxas to assemble each kernel, and on a kernel's first launch
compiles a small C launcher with the system's C compiler (gcc runs cc1, as, collect2 and ld) after
asking `ldconfig -p` where libcuda is. Landlock's execute right is granted on exactly these files
(their real paths); every other program is refused by the kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from kernelloop.kernels.device import Device


def _real(path: str | None) -> str | None:
    return os.path.realpath(path) if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def ptxas(arch: int = 90) -> str | None:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return _real(str(get_ptxas(arch).path))
    except Exception:  # noqa: BLE001 (no nvidia backend in this triton build)
        return None


def _gcc_parts(gcc: str) -> list[str | None]:
    parts = []
    for name in ("cc1", "collect2", "as", "ld"):
        try:
            found = subprocess.run([gcc, f"-print-prog-name={name}"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        parts.append(found if os.path.isabs(found) else shutil.which(found))
    return parts


def allowed_executables(device: Device) -> tuple[str, ...]:
    """What a sandboxed process on `device` may start: nothing where Triton interprets."""
    if device.interpreted:
        return ()
    import torch

    major, minor = torch.cuda.get_device_capability()
    return cuda_executables(major * 10 + minor)


def cuda_executables(arch: int) -> tuple[str, ...]:
    """Real paths of ptxas (for `arch`, e.g. 90), the C toolchain Triton's launcher build uses, ldconfig."""
    gcc = shutil.which("gcc")
    candidates = [ptxas(arch), gcc, shutil.which("clang"), "/sbin/ldconfig", shutil.which("ldconfig")]
    if gcc:
        candidates += _gcc_parts(gcc)
    return tuple(sorted({p for p in map(_real, candidates) if p}))
