"""Where an engine step's time goes, recorded while profiling is on (off: one `is None` check).

A `Recorder` is installed on an Engine (`engine.recorder`) and on its Dispatcher (`observer`). It
times named regions of a step (schedule, forward, sample) and every call of every op, keyed by
(op, dtype, exact shape); every projection and both attentions of the forward are ops. CPU:
`time.perf_counter` around each region (CPU work is synchronous). CUDA: a pair of CUDA events per
region, resolved once at `collect()`, so the GPU is never synchronised mid-step. With `trace=True`
every region is also a `torch.profiler.record_function` (`kernelloop::<name>`), which labels a
Chrome trace.

Op times on CUDA are device (kernel) times, not the in-run event brackets: eager decode of a large
model is bound by the host, so an event pair around one op call mostly measures the gap while the
host launches it. With a Dispatcher attached (`attach`), `collect()` replays each observed
(op, dtype, bucket) in isolation with `kernels.timing.time_calls` (an L2 flush queued ahead of
every call keeps the GPU busy while the host launches, so the event pair times the kernel; the same
timing the sandbox judges candidates with) on the variant that served it in the run, at up to
`REPLAY_SAMPLES` of its observed shapes, and prices every observed shape by interpolating in bytes
moved. Each op entry says which source its seconds come from (`timing`):

    cpu-wall             perf_counter around each call in the run (CPU: calls are synchronous)
    cuda-events          a CUDA-event pair around each call in the run (includes launch gaps)
    cuda-kernel-replay   device time of the serving variant, replayed in isolation (see above)
    cpu-wall-replay      the same replay on CPU (a rehearsal of the GPU path; interpreter times)

`collect()` returns raw seconds; profiler/ turns them into shares, buckets and roofline figures.

Stopping from another thread (the HTTP server, while the engine is mid-step): whoever drives the
steps calls `commit()` after each one; `close()`, from any thread, stops the recording and keeps what
was committed, so a step cut in half never lands in the figures. `set_time_limit(s)` makes the
Recorder close itself the first time it is used after `s` seconds (a profile nobody stops).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

import torch

from kernelloop.kernels.device import Device
from kernelloop.kernels.spec import OpSpec, dtype_name, parse_dtype

if TYPE_CHECKING:
    from kernelloop.kernels.dispatch import Dispatcher

STEP, SCHEDULE, FORWARD, SAMPLE = "step", "schedule", "forward", "sample"  # region names (profiler/analysis.py reads them)
STEP_REGIONS = (SCHEDULE, FORWARD, SAMPLE)  # direct parts of a step; the rest is Python overhead
OP_TIMINGS = ("auto", "replay", "in-run")  # auto: replay on CUDA (with a dispatcher attached), in-run on CPU
REPLAY_SAMPLES = 3  # shapes replayed per (op, dtype, bucket): smallest, middle and largest by bytes moved
REPLAY_BUDGET_S = 30.0  # replay stops after this long; the (op, dtype, bucket) left keep their in-run times
# (warmup, timed) calls per replayed shape; the interpreter compiles nothing, and takes ~0.1 s a call
REPLAY_REPS = {"cuda": (3, 10), "cpu": (0, 1)}


def in_run_timing(device: Device) -> str:
    return device.timer


def replay_timing(device: Device) -> str:
    return "cpu-wall-replay" if device.interpreted else "cuda-kernel-replay"


class Recorder:
    def __init__(self, device: Device, trace: bool = False, dispatcher: "Dispatcher | None" = None,
                 op_timing: str = "auto") -> None:
        self.device = device
        self.cuda = device.timer == "cuda-events"  # regions bracketed by CUDA events
        self.trace = trace
        self._regions: dict[str, list[Any]] = defaultdict(list)  # name -> seconds (CPU) or event pairs (CUDA)
        self._ops: dict[tuple[str, str, tuple], list[Any]] = defaultdict(list)
        self.dispatcher: Dispatcher | None = None
        self.op_timing = "auto"
        self.attach(dispatcher, op_timing)
        self._lock = threading.Lock()  # commit() and close() come from different threads
        self._committed: tuple[dict[str, int], dict[tuple, int]] = ({}, {})  # sample counts at the last commit()
        self.deadline: float | None = None  # perf_counter time after which the Recorder closes itself
        self.closed_at: float | None = None
        self.auto_stopped = False

    def attach(self, dispatcher: "Dispatcher | None", op_timing: str = "auto") -> None:
        """The Dispatcher whose variants `collect()` replays, and when: "auto" (on CUDA), "replay"
        (on any device: the CPU rehearsal of the GPU path) or "in-run" (never)."""
        if op_timing not in OP_TIMINGS:
            raise ValueError(f"op_timing must be one of {', '.join(OP_TIMINGS)}, not {op_timing!r}")
        self.dispatcher, self.op_timing = dispatcher, op_timing

    def set_time_limit(self, seconds: float) -> None:
        """Close by itself (keeping what was committed) the first time it is used after `seconds`."""
        self.deadline = time.perf_counter() + seconds

    def recording(self) -> bool:
        """Whether samples are still taken; past the time limit this closes the Recorder."""
        if self.closed_at is not None:
            return False
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.close(auto=True)
            return False
        return True

    def commit(self) -> None:
        """Everything recorded so far is complete (a step ended): `close()` keeps it."""
        with self._lock:
            if self.closed_at is None:
                self._committed = ({k: len(v) for k, v in self._regions.items()},
                                   {k: len(v) for k, v in self._ops.items()})

    def close(self, auto: bool = False) -> bool:
        """Stop recording, from any thread, keeping the samples up to the last `commit()` (those of a
        step in flight are dropped). Returns False if it was closed already."""
        with self._lock:
            if self.closed_at is not None:
                return False
            self.closed_at, self.auto_stopped = time.perf_counter(), auto
            regions, ops = self._committed
            # new containers: a call in flight appends to the old list, which nothing reads any more
            self._regions = defaultdict(list, {k: list(self._regions[k][:n]) for k, n in regions.items() if n})
            self._ops = defaultdict(list, {k: list(self._ops[k][:n]) for k, n in ops.items() if n})
            return True

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        if not self.recording():
            yield
            return
        with self._timed(self._regions[name], name):
            yield

    def op(self, spec: OpSpec, args: tuple) -> ContextManager:
        """The Dispatcher's observer: times one op call under its (op, dtype, shape)."""
        if not self.recording():
            return nullcontext()
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
        self.device.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in samples]

    def replays(self) -> bool:
        """Whether `collect()` replaces in-run op times with replayed device times."""
        if self.dispatcher is None or self.op_timing == "in-run":
            return False
        return self.op_timing == "replay" or self.cuda

    def collect(self, replay: bool = True) -> dict[str, Any]:
        """{"device", "region_timing", "op_timing", "regions": {name: {"calls", "seconds"}},
        "ops": [{"op", "dtype", "shape", "calls", "seconds", "timing", "in_run_seconds", "replayed"}],
        "replay_errors": [str]}. Call it after recording stopped (the replay calls the kernels).
        `replay=False` leaves the replay to a later `replay(raw)` (between two engine steps)."""
        timing = in_run_timing(self.device)
        regions = {name: {"calls": len(s), "seconds": sum(self._seconds(s))} for name, s in dict(self._regions).items()}
        ops = [{"op": op, "dtype": dtype, "shape": dict(shape), "calls": len(s), "seconds": sum(self._seconds(s)),
                "timing": timing}
               for (op, dtype, shape), s in dict(self._ops).items()]
        raw = {"device": self.device.kind, "region_timing": timing, "op_timing": _label(ops),
               "regions": regions, "ops": ops, "replay_errors": []}
        return self.replay(raw) if replay else raw

    def replay(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`raw` (from `collect(replay=False)`) with replayed op times where `replays()`; runs kernels."""
        if not self.replays() or not raw["ops"]:
            return raw
        try:
            ops, errors = replay_op_seconds(raw["ops"], self.dispatcher, self.device)
        except Exception as exc:  # the in-run times stand, labelled as such
            ops, errors = raw["ops"], [f"replay failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]]
        return {**raw, "ops": ops, "op_timing": _label(ops), "replay_errors": errors}


def _label(ops: list[dict[str, Any]]) -> str | None:
    labels = sorted({o["timing"] for o in ops})
    return "+".join(labels) if labels else None


def interpolate(x: float, points: list[tuple[float, float]]) -> float:
    """y at `x` on the piecewise-linear curve through `points` (sorted by x), flat beyond the ends."""
    if not points:
        raise ValueError("interpolate: no points")
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def _sample_indices(n: int, samples: int) -> list[int]:
    """Up to `samples` indices evenly spread over range(n), always the first and the last."""
    if n <= samples:
        return list(range(n))
    if samples <= 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (samples - 1)) for i in range(samples)})


def _serving_variant(dispatcher: "Dispatcher", spec: OpSpec, dtype: str, bucket: str) -> Callable[..., Any]:
    """The function that served (op, dtype, bucket) in the run (after any fallback), called directly:
    a replay that raises must not demote a variant in the live dispatcher."""
    chain = dispatcher.resolve(spec, dtype, bucket)
    name = dispatcher.ops[spec.name].variants_in_use().get(f"{dtype} {bucket}") if spec.name in dispatcher.ops else None
    return next((v.fn for v in chain if v.name == name), chain[0].fn)


def _replay_one(fn: Callable[..., Any], args: tuple, device: Device, warmup: int, reps: int) -> float:
    """Median seconds per call of `fn(*args)` (kernels.timing: CUDA events after an L2 flush; perf_counter on CPU)."""
    from kernelloop.kernels.timing import summarize, time_calls

    return summarize(time_calls(lambda: fn(*args), device, warmup=warmup, reps=reps))["median"]


def replay_op_seconds(ops: list[dict[str, Any]], dispatcher: "Dispatcher", device: Device, *,
                      samples: int = REPLAY_SAMPLES, budget_s: float = REPLAY_BUDGET_S) -> tuple[list[dict[str, Any]], list[str]]:
    """`ops` (a Recorder's op entries) with seconds = calls x replayed seconds per call, and the errors.

    Per (op, dtype, bucket): the observed shapes sorted by bytes moved (the op's cost model), up to
    `samples` of them (first, middle, last) replayed on seeded inputs (`spec.make_inputs`) with the
    variant that served the bucket; every observed shape gets the per-call time interpolated in
    bytes between the replayed ones. A bucket whose replay raises or that the budget leaves out keeps
    its in-run seconds and label. Entries gain `in_run_seconds` and `replayed` (its exact shape ran)."""
    warmup, reps = REPLAY_REPS[device.kind]
    label = replay_timing(device)
    out = [{**o, "in_run_seconds": o["seconds"], "replayed": False} for o in ops]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for o in out:
        op = dispatcher.ops.get(o["op"])
        if op is not None:
            groups[(o["op"], o["dtype"], op.spec.bucket(o["shape"]))].append(o)
    errors: list[str] = []
    deadline = time.perf_counter() + budget_s
    # costliest buckets first (by in-run time), so a budget cut leaves the cheapest ones
    for (name, dtype_s, bucket), entries in sorted(groups.items(), key=lambda kv: -sum(e["seconds"] for e in kv[1])):
        if time.perf_counter() > deadline:
            errors.append(f"{name} {dtype_s} {bucket}: not replayed (the {budget_s:g} s replay budget was spent)")
            continue
        spec = dispatcher.ops[name].spec
        dtype = parse_dtype(dtype_s)
        try:
            fn = _serving_variant(dispatcher, spec, dtype_s, bucket)
            moved = {id(e): spec.cost(e["shape"], dtype).bytes for e in entries}
            entries.sort(key=lambda e: moved[id(e)])
            points = []
            for i in _sample_indices(len(entries), samples):
                per_call = _replay_one(fn, spec.make_inputs(entries[i]["shape"], dtype, 0, device.torch), device, warmup, reps)
                points.append((float(moved[id(entries[i])]), per_call))
                entries[i]["replayed"] = True
        except Exception as exc:  # out of memory, a kernel that raises on fresh inputs: keep the in-run times
            errors.append(f"{name} {dtype_s} {bucket}: {type(exc).__name__}: {exc}".splitlines()[0][:300])
            for e in entries:
                e["replayed"] = False
            continue
        points.sort()
        for e in entries:
            e["seconds"] = e["calls"] * interpolate(float(moved[id(e)]), points)
            e["timing"] = label
    return out, errors


def region(recorder: Recorder | None, name: str) -> ContextManager:
    """`recorder.region(name)`, or a no-op when not profiling."""
    return nullcontext() if recorder is None else recorder.region(name)
