"""Timing primitives shared by the benchmarks and the sandbox.

On CUDA every call is bracketed by CUDA events, after an L2 flush that runs outside the timed
region, so a call never finds its inputs warm in L2 from the call before. On CPU (Triton's
interpreter) calls are timed with `time.perf_counter`. All results are seconds per call.

The flush (`flush_l2=`) comes in two kinds. "read" (the default, also `True`) sums a 256 MB buffer
into one number: L2 is left full of clean lines (evicting them costs nothing) and the dirty lines of
the call before are written back during the flush. "write" zeroes the same buffer: L2 is left full
of *dirty* lines, which the timed kernel then writes back to memory as it evicts them, so part of
the flush's cost lands inside the timed region (kept to measure the difference: bench.sandbox_gpu).
`False` times with a warm L2. CPU has nothing to flush: every kind is accepted there and does nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Union

import torch

from kernelloop.kernels.device import Device

L2_FLUSH_BYTES = 256 * 1024 * 1024  # well above any current GPU's L2 (H100/H200: 50 MB)
FLUSH_KINDS = ("write", "read")
FlushL2 = Union[bool, Literal["write", "read"]]
_flush_buffers: dict[torch.device, torch.Tensor] = {}
_flush_sinks: dict[torch.device, torch.Tensor] = {}


def flush_kind(flush_l2: FlushL2 | None) -> str | None:
    """"write", "read" or None (no flush) for a `flush_l2=` value; ValueError for anything else."""
    if flush_l2 is None or flush_l2 is False:
        return None
    if flush_l2 is True:
        return "read"
    if isinstance(flush_l2, str) and flush_l2 in FLUSH_KINDS:
        return flush_l2
    raise ValueError(f"flush_l2 must be True, False, 'write' or 'read', got {flush_l2!r}")


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    if dev not in _flush_buffers:
        _flush_buffers[dev] = torch.zeros(L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
    return _flush_buffers[dev]


def l2_flusher(dev: torch.device, flush_l2: FlushL2 | None) -> Callable[[], None] | None:
    """The CUDA work that flushes L2 before a timed call (queued, not waited for); None for no flush.

    "write": `zero_()` of the 256 MB buffer. "read": an int64 sum of the same buffer into a
    preallocated one-element tensor (reads only: L2 is left clean)."""
    kind = flush_kind(flush_l2)
    if kind is None:
        return None
    buf = _flush_buffer(dev)
    if kind == "write":
        return buf.zero_
    if dev not in _flush_sinks:
        _flush_sinks[dev] = torch.zeros((), dtype=torch.int64, device=dev)
    words, sink = buf.view(torch.int64), _flush_sinks[dev]

    def read() -> None:
        torch.sum(words, dim=0, out=sink)

    return read


def time_calls(
    fn: Callable[[], Any], device: Device, *, warmup: int, reps: int, flush_l2: FlushL2 = True
) -> list[float]:
    """Seconds taken by each of `reps` calls of `fn()`, after `warmup` untimed calls.

    CUDA: one pair of events per call; the L2 flush (`flush_l2`: True or "write" zeroes a 256 MB
    buffer, "read" sums it, False skips it; see the module's doc) is queued before the start event,
    and the host synchronises once, after the last call. CPU: wall time per call (no flush).
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"time_calls: need reps >= 1 and warmup >= 0, got reps={reps} warmup={warmup}")
    flush_kind(flush_l2)  # a bad value fails on CPU too, not first on the GPU
    if device.timer == "cuda-events":
        dev = torch.device("cuda", torch.cuda.current_device())
        return _time_cuda(fn, dev, warmup, reps, flush_l2)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def _time_cuda(fn: Callable[[], Any], dev: torch.device, warmup: int, reps: int, flush_l2: FlushL2) -> list[float]:
    flush = l2_flusher(dev, flush_l2)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(dev)  # nothing earlier may land inside the first timed region
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(dev)
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]  # ms -> s


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: list[float]) -> dict[str, float]:
    """median, p20, p80 and min of per-call samples (plus their count `n`)."""
    if not samples:
        raise ValueError("summarize: no samples")
    ordered = sorted(samples)
    return {
        "median": _quantile(ordered, 0.5),
        "p20": _quantile(ordered, 0.2),
        "p80": _quantile(ordered, 0.8),
        "min": ordered[0],
        "n": len(ordered),
    }


def auto_reps(
    fn: Callable[[], Any], device: Device, *, target_s: float, min_reps: int, max_reps: int
) -> tuple[int, float]:
    """(reps, estimate): how many calls fill about `target_s`, from a 3-call estimate (1 on CPU)."""
    probe = 1 if device.interpreted else 3
    estimate = summarize(time_calls(fn, device, warmup=1, reps=probe))["median"]
    reps = int(target_s / max(estimate, 1e-7))
    return max(min_reps, min(max_reps, reps)), estimate


def measure_copy_bandwidth(device: Device, nbytes: int | None = None) -> float:
    """Achieved bytes/s of a large device-to-device copy (bytes read + bytes written).

    The roofline every op's achieved GB/s is compared with: 1 GiB on CUDA, 256 MiB on CPU.
    """
    nbytes = device.copy_bytes if nbytes is None else nbytes
    src = torch.ones(nbytes, dtype=torch.uint8, device=device.torch)
    dst = torch.empty_like(src)
    samples = time_calls(lambda: dst.copy_(src), device, warmup=2, reps=10, flush_l2=False)
    return 2 * nbytes / summarize(samples)["median"]
