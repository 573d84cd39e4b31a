"""Full-precision float32 matmuls for references and roofline measurements.

A float32 reference computed with TF32 (10-bit mantissa) is a different result, and a matmul peak
measured with it is a different ceiling. torch's one setting for both CPU and CUDA float32 matmuls
is `torch.set_float32_matmul_precision`; this is the only place the project touches it (mixing it
with the `allow_tf32` flags can make torch refuse to answer which one is in force).
"""

from __future__ import annotations

import torch


class full_precision_matmuls:
    """float32 matmuls in IEEE float32 (no TF32, no bf16 passes) inside; the setting is restored.
    A class, not a generator: the engine's reference path enters it for every projection."""

    def __enter__(self) -> None:
        self._saved = torch.get_float32_matmul_precision()
        if self._saved != "highest":
            torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc: object) -> None:
        if self._saved != "highest":
            torch.set_float32_matmul_precision(self._saved)
