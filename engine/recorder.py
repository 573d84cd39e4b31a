"""Where an engine step's time goes, recorded while profiling is on (off: one `is None` check).

A `Recorder` is installed on an Engine (`engine.recorder`) and on its Dispatcher (`observer`). It
times named regions of a step (schedule, forward, matmul, prefill attention, sample) and every call
of every op, keyed by (op, dtype, exact shape). CPU: `time.perf_counter` around each region (CPU
work is synchronous). CUDA: a pair of CUDA events per region, resolved once at `collect()`, so the
GPU is never synchronised mid-step. With `trace=True` every region is also a
`torch.profiler.record_function` (`kernelloop::<name>`), which labels a Chrome trace.

`collect()` returns raw seconds; profiler/ turns them into shares, buckets and roofline figures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator

import torch

from kernels.spec import OpSpec, dtype_name

STEP_REGIONS = ("schedule", "forward", "sample")  # direct parts of a step; the rest is Python overhead
FORWARD_REGIONS = ("matmul", "attention_prefill")  # parts of the forward outside the op library


class Recorder:
    def __init__(self, device: torch.device | str, trace: bool = False) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.trace = trace
        self._regions: dict[str, list[Any]] = defaultdict(list)  # name -> seconds (CPU) or event pairs (CUDA)
        self._ops: dict[tuple[str, str, tuple], list[Any]] = defaultdict(list)

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        with self._timed(self._regions[name], name):
            yield

    def op(self, spec: OpSpec, args: tuple) -> ContextManager:
        """The Dispatcher's observer: times one op call under its (op, dtype, shape)."""
        shape = tuple(sorted(spec.shape_of(*args).items()))
        return self._timed(self._ops[(spec.name, dtype_name(args[0].dtype), shape)], spec.name)

    @contextmanager
    def _timed(self, sink: list, label: str) -> Iterator[None]:
        tracing = torch.profiler.record_function(f"kernelloop::{label}") if self.trace else nullcontext()
        with tracing:
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                try:
                    yield
                finally:
                    end.record()
                    sink.append((start, end))
            else:
                t0 = time.perf_counter()
                try:
                    yield
                finally:
                    sink.append(time.perf_counter() - t0)

    def _seconds(self, samples: list[Any]) -> list[float]:
        if not self.cuda:
            return samples
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in samples]

    def collect(self) -> dict[str, Any]:
        """{"regions": {name: {"calls", "seconds"}}, "ops": [{"op", "dtype", "shape", "calls", "seconds"}]}."""
        regions = {name: {"calls": len(s), "seconds": sum(self._seconds(s))} for name, s in self._regions.items()}
        ops = [{"op": op, "dtype": dtype, "shape": dict(shape), "calls": len(s), "seconds": sum(self._seconds(s))}
               for (op, dtype, shape), s in self._ops.items()]
        return {"device": "cuda" if self.cuda else "cpu", "regions": regions, "ops": ops}


def region(recorder: Recorder | None, name: str) -> ContextManager:
    """`recorder.region(name)`, or a no-op when not profiling."""
    return nullcontext() if recorder is None else recorder.region(name)


def timed(recorder: Recorder | None, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, wrapped in a region when profiling; `fn` itself otherwise (no cost when off)."""
    if recorder is None:
        return fn

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with recorder.region(name):
            return fn(*args, **kwargs)

    return wrapper
