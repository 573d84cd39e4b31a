"""kernelloop's op library, kernel registry and dispatch.

Importing this package is cheap (no torch, no Triton): `agent --help` and the errors module load
without them. Loading the op table (`kernelloop.kernels.ops`, or `OPS`/`get_op` from here) configures
Triton first (interpreter when there is no CUDA device), before any kernel is decorated; see
kernels/device.py.
"""

from typing import Any

__all__ = ["OPS", "get_op"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kernelloop.kernels import ops

        return getattr(ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
