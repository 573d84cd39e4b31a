"""Timing primitives shared by the benchmarks and the sandbox.

On CUDA every call is bracketed by CUDA events, after an L2 flush that runs outside the timed
region, so a call never finds its inputs warm in L2 from the call before. On CPU (Triton's
interpreter) calls are timed with `time.perf_counter`. All results are seconds per call.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable

import torch

from kernels.device import cache_root, device_fingerprint

L2_FLUSH_BYTES = 256 * 1024 * 1024  # well above any current GPU's L2 (H100/H200: 50 MB)
_flush_buffers: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    if dev not in _flush_buffers:
        _flush_buffers[dev] = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
    return _flush_buffers[dev]


def time_calls(
    fn: Callable[[], Any], device: str | torch.device, *, warmup: int, reps: int, flush_l2: bool = True
) -> list[float]:
    """Seconds taken by each of `reps` calls of `fn()`, after `warmup` untimed calls.

    CUDA: one pair of events per call; the L2 flush (zeroing a 256 MB buffer) is queued before
    the start event, and the host synchronises once, after the last call. CPU: wall time per call.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"time_calls: need reps >= 1 and warmup >= 0, got reps={reps} warmup={warmup}")
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        with torch.cuda.device(dev):
            return _time_cuda(fn, dev, warmup, reps, flush_l2)
    if dev.type != "cpu":
        raise ValueError(f"time_calls: unsupported device {device!r}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def _time_cuda(fn: Callable[[], Any], dev: torch.device, warmup: int, reps: int, flush_l2: bool) -> list[float]:
    flush = _flush_buffer(dev) if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(dev)  # nothing earlier may land inside the first timed region
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.zero_()
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
    fn: Callable[[], Any], device: str | torch.device, *, target_s: float, min_reps: int, max_reps: int
) -> tuple[int, float]:
    """(reps, estimate): how many calls fill about `target_s`, from a 3-call estimate (1 on CPU)."""
    probe = 3 if torch.device(device).type == "cuda" else 1
    estimate = summarize(time_calls(fn, device, warmup=1, reps=probe))["median"]
    reps = int(target_s / max(estimate, 1e-7))
    return max(min_reps, min(max_reps, reps)), estimate


def measure_copy_bandwidth(device: str | torch.device, nbytes: int | None = None) -> float:
    """Achieved bytes/s of a large device-to-device copy (bytes read + bytes written).

    The roofline every op's achieved GB/s is compared with: 1 GiB on CUDA, 256 MiB on CPU.
    """
    dev = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if dev.type == "cuda" else (256 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    samples = time_calls(lambda: dst.copy_(src), dev, warmup=2, reps=10, flush_l2=False)
    seconds = summarize(samples)["median"]
    del src, dst
    return 2 * nbytes / seconds


def cached_copy_bandwidth(device: str | torch.device) -> float:
    """`measure_copy_bandwidth`, measured once per device fingerprint and cached in <cache>/bandwidth.json."""
    path = cache_root() / "bandwidth.json"
    key = device_fingerprint(device)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    if isinstance(cached.get(key), (int, float)):
        return float(cached[key])
    cached[key] = value = measure_copy_bandwidth(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bandwidth-")
    with os.fdopen(fd, "w") as f:
        json.dump(cached, f, indent=1)
    os.replace(tmp, path)
    return value
