"""Full-precision float32 matmuls for references and roofline measurements.

A float32 reference computed with TF32 (10-bit mantissa) is a different result, and a matmul peak
measured with it is a different ceiling. torch's one setting for both CPU and CUDA float32 matmuls
is `torch.set_float32_matmul_precision`; this is the only place the project touches it (mixing it
with the `allow_tf32` flags can make torch refuse to answer which one is in force).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def full_precision_matmuls() -> Iterator[None]:
    """float32 matmuls in IEEE float32 (no TF32, no bf16 passes) inside; the setting is restored."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)
