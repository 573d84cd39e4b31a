"""The roofline: the least time a call can take on this device, from its bytes and its FLOPs.

    seconds >= max(cost.bytes / copy bandwidth, cost.flops / matmul peak in the call's dtype)

Both rates are measured on the device (a large device-to-device copy; a large dense matmul in the
dtype, TF32 off so float32 is IEEE float32) and cached per device fingerprint in <cache>/roofline.json.
A memory-bound op (the norms, silu_mul, decode attention) is held to its bytes, a GEMM to its FLOPs.
On CPU the rates are torch's on the CPU, while the kernels run in Triton's interpreter: the
percentages describe the interpreter (`cpu-interpreter`), never a GPU.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch

from kernelloop.common.paths import cache_root
from kernelloop.kernels.device import Device, device_fingerprint
from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.spec import Cost, dtype_name
from kernelloop.kernels.timing import measure_copy_bandwidth, summarize, time_calls


def measure_matmul_peak(device: Device, dtype: torch.dtype) -> float:
    """FLOP/s of a large square matmul in `dtype` (float32 without TF32)."""
    dev, n = device.torch, device.matmul_size
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype=dtype, device=dev)
    b = torch.randn(n, n, generator=g).to(dtype=dtype, device=dev)
    out = torch.empty(n, n, dtype=dtype, device=dev)
    with full_precision_matmuls():
        samples = time_calls(lambda: torch.matmul(a, b, out=out), device, warmup=2, reps=10, flush_l2=False)
    return 2 * n**3 / summarize(samples)["median"]


def _cached(key: str, measure: Callable[[], float]) -> float:
    """`measure()`, once per key across processes; <cache>/roofline.json, replaced atomically."""
    path = cache_root() / "roofline.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    if isinstance(cached.get(key), (int, float)) and cached[key] > 0:
        return float(cached[key])
    cached[key] = value = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".roofline-")
    with os.fdopen(fd, "w") as f:
        json.dump(cached, f, indent=1)
    os.replace(tmp, path)
    return value


def copy_bandwidth(device: Device) -> float:
    """Bytes/s (read + write) of a large device-to-device copy, measured once per device."""
    return _cached(f"{device_fingerprint(device)} copy", lambda: measure_copy_bandwidth(device))


def matmul_peak(device: Device, dtype: torch.dtype) -> float:
    """FLOP/s of a large matmul in `dtype`, measured once per device and dtype. On CPU always float32:
    the interpreter computes every dot in float32, and torch's bf16 CPU matmul can be far slower."""
    if device.interpreted:
        dtype = torch.float32
    return _cached(f"{device_fingerprint(device)} matmul {dtype_name(dtype)}", lambda: measure_matmul_peak(device, dtype))


@dataclass(frozen=True)
class Rates:
    """A device's measured ceilings for calls in one dtype."""

    bytes_per_s: float  # copy bandwidth, read + write
    flops_per_s: float  # dense matmul throughput in the dtype

    def seconds(self, cost: Cost) -> float:
        """The least time one call with this cost can take."""
        return max(cost.bytes / self.bytes_per_s, cost.flops / self.flops_per_s)

    def bound(self, cost: Cost) -> str:
        """"memory" or "compute": which side of the roofline the call sits on."""
        return "compute" if cost.flops / self.flops_per_s > cost.bytes / self.bytes_per_s else "memory"


def device_rates(device: Device, dtype: torch.dtype) -> Rates:
    """The roofline of `device` for `dtype`, each rate measured once and cached."""
    return Rates(copy_bandwidth(device), matmul_peak(device, dtype))
