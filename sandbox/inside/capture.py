"""Describing the launches a candidate's `forward` makes at shapes it is never run at (runner side).

Runs in the runner (sandbox/inside/worker.py), the process that imported the candidate, for the judge's
"capture" message: per requested (shape, dtype), `forward` is called on meta inputs
(`kernels.target_compile.meta_inputs`: no data, so an engine shape costs nothing) while every
`kernel[grid](...)` is recorded instead of run. The answer is plain JSON, launches in the record
format of sandbox/inside/trace.py (tensors as {"ptr", "byte_offset", "dtype"}, the buffer id meaningless):

    {"type": "captured", "shapes": [{"launches": [{"kernel", "args", "kwargs"}, ...], "error": None}, ...],
     "violations": [...]}

It is the candidate's claim, nothing more: the judge compiles it in another process, from its own
copy of the source, and compares it with the launches the candidate really made at a test shape.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from kernelloop.kernels.spec import OpSpec, dtype_name, parse_dtype
from kernelloop.kernels.target_compile import meta_inputs
from kernelloop.sandbox.inside import guards, trace
from kernelloop.sandbox.messages import Capture, Captured, CapturedShape, Error

MAX_REQUESTS = 16
MAX_LAUNCHES = 16  # per shape: more is refused by the judge anyway


class _Describer(trace.Recorder):
    """trace.Recorder's kernel-argument encoding, for meta tensors (which share one null storage)."""

    def _buffer_of(self, t: Any) -> int:
        return 0


@contextlib.contextmanager
def described_launches() -> Iterator[list[dict[str, Any]]]:
    """Every JIT launch inside the block is described, not run (compiled and interpreted kernels alike)."""
    from triton.runtime import interpreter, jit

    found: list[dict[str, Any]] = []
    describer = _Describer()
    classes = (jit.JITFunction, interpreter.InterpretedFunction)
    saved = [cls.run for cls in classes]

    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        if len(found) >= MAX_LAUNCHES:
            raise trace.Untraceable(f"more than {MAX_LAUNCHES} launches in one call")
        found.append({"kernel": str(self.fn.__name__),
                      "args": [describer._kernel_arg(a) for a in args],
                      "kwargs": {str(k): describer._kernel_arg(v) for k, v in kwargs.items()}})

    for cls in classes:
        cls.run = run
    try:
        yield found
    finally:
        for cls, original in zip(classes, saved):
            cls.run = original


def _request(spec: OpSpec, request: Any) -> tuple[dict[str, int], str]:
    if not isinstance(request, dict) or not isinstance(request.get("shape"), dict):
        raise ValueError("malformed capture request")
    shape, dtype = request["shape"], request.get("dtype")
    if set(shape) != set(spec.test_shapes[0]) or not all(type(v) is int and 0 <= v < 1 << 31 for v in shape.values()):
        raise ValueError("malformed capture shape")
    if dtype not in [dtype_name(d) for d in spec.dtypes]:
        raise ValueError("malformed capture dtype")
    return shape, dtype


def answer(forward: Callable[..., Any], spec: OpSpec, header: Capture) -> Captured | Error:
    """The "captured" message for a "capture" message {"requests": [{"shape", "dtype"}, ...]}."""
    requests = header["requests"]
    if len(requests) > MAX_REQUESTS:
        return Error(type="error", error="malformed capture message", violations=[])
    violations = len(guards.VIOLATIONS)
    shapes = []
    for request in requests:
        shape, dtype = _request(spec, request)
        entry = CapturedShape(launches=[], error=None)
        try:
            inputs = meta_inputs(spec, shape, parse_dtype(dtype))
            with described_launches() as found:
                forward(*inputs)
            entry["launches"] = found
        except BaseException as exc:  # noqa: BLE001  (the candidate's failure, reported as data)
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        shapes.append(entry)
    return Captured(type="captured", shapes=shapes, violations=guards.VIOLATIONS[violations:][:5])
