"""kernelloop's op library, kernel registry and dispatch.

Importing this package configures Triton (interpreter when there is no CUDA device) before any
kernel module is imported; see kernels/device.py.
"""

from kernelloop.kernels.device import configure_triton

configure_triton()

from kernelloop.kernels.ops import OPS, get_op  # noqa: E402  (must follow configure_triton)

__all__ = ["OPS", "get_op"]
