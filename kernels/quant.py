"""Weight-only quantization schemes: how a projection's weight [N, K] is stored, and read back.

Each scheme has an op (kernels/ops/linear_<scheme>.py) whose kernel dequantizes in the kernel; its
reference is `dequantize` followed by the float32 matmul, so the judge checks a kernel against its own
scheme exactly, and the error of quantizing is measured end to end (agent quantize, the gate).

- int8: symmetric per output channel. qweight int8 [N, K], scales float32 [N]; w ~ q * scale.
- int4: symmetric per group of `group_size(K)` along K. qweight uint8 [N, K // 2], two values per byte
  (k = 2j in the low nibble, k = 2j + 1 in the high one), each stored as q + 8 with q in [-8, 7];
  scales float32 [N, K // group]; the group is K // scales.shape[1].
- fp8: e4m3 (float8_e4m3fn) per output channel. qweight float8_e4m3fn [N, K], scales float32 [N]. Only
  where the device computes fp8 (CUDA capability 8.9 and up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import Device

INT4_GROUPS = (128, 64)  # the largest that divides K
FP8_MAX = 448.0  # largest finite float8_e4m3fn


class QuantizationError(KernelloopError):
    """A weight this scheme cannot hold (e.g. a K no int4 group divides)."""


def _scales(absmax: torch.Tensor, qmax: float) -> torch.Tensor:
    return torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.detach().float()
    scales = _scales(w.abs().amax(dim=1), 127.0)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.contiguous()


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return qweight.float() * scales.float()[:, None]


def group_size(k: int) -> int:
    """The int4 group along K: 128, or 64 where K is not a multiple of 128; QuantizationError otherwise."""
    for g in INT4_GROUPS:
        if k % g == 0:
            return g
    raise QuantizationError(f"int4 needs K divisible by {' or '.join(map(str, INT4_GROUPS))}; K is {k}")


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.detach().float()
    n, k = w.shape
    g = group_size(k)
    grouped = w.view(n, k // g, g)
    scales = _scales(grouped.abs().amax(dim=2), 7.0)
    q = torch.round(grouped / scales[:, :, None]).clamp(-8, 7).view(n, k).to(torch.int16) + 8
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, half = qweight.shape
    k = 2 * half
    p = qweight.to(torch.int16)
    q = torch.stack(((p & 15) - 8, (p >> 4) - 8), dim=2).view(n, k).float()
    g = k // scales.shape[1]
    return q * scales.float().repeat_interleave(g, dim=1)


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.detach().float()
    scales = _scales(w.abs().amax(dim=1), FP8_MAX)
    q = (w / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scales.contiguous()


def dequantize_fp8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return qweight.float() * scales.float()[:, None]


def _cuda_fp8(device: Device) -> bool:
    if device.interpreted or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() >= (8, 9)


@dataclass(frozen=True)
class Scheme:
    """One way to store a weight: its op, quantize/dequantize, its bytes and where it runs."""

    name: str                   # "int8" | "int4" | "fp8"
    op: str                     # the registry op serving it: "linear_int8", ...
    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # weight [N, K] -> (qweight, scales)
    dequantize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]       # -> float32 [N, K]
    bits: int                   # per weight value
    supported: Callable[[Device], bool] = lambda device: True

    def applies(self, k: int) -> bool:
        """Whether a weight with this K can be stored (int4 needs a group that divides K)."""
        if self.name != "int4":
            return True
        return any(k % g == 0 for g in INT4_GROUPS)

    def weight_bytes(self, n: int, k: int) -> int:
        """Bytes read per call: the quantized values plus their float32 scales."""
        groups = k // group_size(k) if self.name == "int4" else 1
        return n * k * self.bits // 8 + 4 * n * groups


SCHEMES: dict[str, Scheme] = {
    "int8": Scheme("int8", "linear_int8", quantize_int8, dequantize_int8, 8),
    "int4": Scheme("int4", "linear_int4", quantize_int4, dequantize_int4, 4),
    "fp8": Scheme("fp8", "linear_fp8", quantize_fp8, dequantize_fp8, 8, supported=_cuda_fp8),
}
SCHEME_OF_OP: dict[str, Scheme] = {s.op: s for s in SCHEMES.values()}


def scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise QuantizationError(f"unknown quantization scheme {name!r}; expected one of {', '.join(SCHEMES)}")
    return SCHEMES[name]
