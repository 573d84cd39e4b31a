"""Recording one `forward` call as data the replay can redo without the candidate's Python.

Runs in the candidate's process (sandbox/inside/worker.py). During one call, a TorchDispatchMode sees every
aten op the candidate's Python side runs, and a hook on Triton's launch path sees every kernel
launch. The record lists, in order:

    {"kind": "aten", "op": "aten.copy_.default", "args": [...], "kwargs": {...}, "new": [buffer ids]}
    {"kind": "launch", "kernel": "_rmsnorm_kernel", "args": [...], "kwargs": {...}, "grid": [x, y, z]}
    {"kind": "literal", "dtype": "int32", "shape": [], "values": [7], "new": [buffer id]}

and `outputs`: how each returned tensor is a view of a buffer. Buffers are the call's tensor inputs
(ids 0..k-1, in argument order) and the storages aten ops created during the call (numbered in
order). Tensors in the record are references: {"buf", "offset", "shape", "stride", "dtype"} (aten
args, outputs) or {"ptr": buf, "byte_offset", "dtype"} (kernel pointers). Views and host reads are
not recorded: they move no data. Ops that compute (anything outside ALLOWED_ATEN) are noted as
forbidden. Fresh allocations are poisoned with a pattern drawn per allocation (sandbox/inside/poison.py), as
they are in the replay, independently.

A literal is an integer or bool tensor made from Python values (`idx[0] = n` lifts `n` into a 0-d
tensor, then copies it): index data a launcher may build. Floating-point tensors made from Python
values are refused (a launcher computing outputs in Python), and at most MAX_PYTHON_VALUES values
per call reach tensors from Python (literal elements, fill values), in the record and in the replay.

Interpreted launches have every load and store checked against the memory they were given
(kernels/interpreter_bounds.py): here that only keeps a bad store from corrupting this process's
heap before the replay, which checks the same way, refuses it.

The record is the candidate's claim about what it did. The judge does not believe it: the replay
redoes it in another process, and its output must equal the candidate's bit for bit.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelloop.kernels import interpreter_bounds as bounds
from kernelloop.sandbox.inside.guards import out_of_memory
from kernelloop.sandbox.inside.poison import poison
from kernelloop.sandbox.wire import WIRE_NAMES

# aten ops a candidate's Python side may run: allocation, views, copies and fills; nothing that computes.
VIEW_ATEN = frozenset({
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "t", "transpose", "permute", "expand",
    "squeeze", "unsqueeze", "select", "slice", "split", "split_with_sizes", "unbind", "narrow", "view_as",
    "alias", "detach", "lift_fresh", "unfold", "diagonal", "movedim", "chunk", "resolve_conj", "resolve_neg",
    "is_same_size", "_has_compatible_shallow_copy_type", "_local_scalar_dense", "record_stream", "contiguous",
    "set_",
})
DATA_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "arange", "clone", "copy_", "_to_copy", "cat", "stack",
})
ALLOWED_ATEN = VIEW_ATEN | DATA_ATEN
ALLOCATORS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
MAX_ENTRIES = 4096
FILLS = frozenset({"fill_", "full", "full_like", "new_full"})  # ops whose value comes from Python
MAX_PYTHON_VALUES = 256
LITERAL_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


class Untraceable(Exception):
    """The call did something the record cannot describe (memory from nowhere, an unknown argument)."""


class Recorder(TorchDispatchMode):
    """Records one call. Use: `rec.begin(args)`, `with rec: out = forward(*args)`, `rec.finish(out)`."""

    def __init__(self) -> None:
        super().__init__()
        self.in_launch = False
        self.entries: list[dict[str, Any]] = []
        self.forbidden: list[str] = []
        self.problem: str | None = None
        self.memory_refused = False  # an allocation the memory limit refused, caught or not
        self._bufs: dict[int, int] = {}  # storage data_ptr -> buffer id
        self._count = self.n_inputs = 0
        self._keep: list[torch.Tensor] = []  # buffers stay alive during the call, so pointers stay unique
        self._values = 0  # values written into tensors from Python during the call
        self._python_floats: set[int] = set()  # storages of float tensors lifted from Python values
        self._regions: dict[int, tuple] = {}  # buffer id -> the bytes a launch may touch in it

    def begin(self, args: tuple) -> None:
        self.entries, self.forbidden, self.problem, self._bufs, self._count, self._keep = [], [], None, {}, 0, []
        self._values, self._python_floats, self.memory_refused = 0, set(), False
        for a in args:
            if isinstance(a, torch.Tensor):
                self._new_buffer(a)
        self.n_inputs = self._count
        self._regions = {}

    def _new_buffer(self, t: torch.Tensor) -> int:
        self._bufs[t.untyped_storage().data_ptr()] = self._count
        self._keep.append(t)
        self._count += 1
        return self._count - 1

    def _buffer_of(self, t: torch.Tensor) -> int:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._python_floats:
            raise Untraceable("a floating-point tensor made from Python values reached a kernel or copy: "
                              "outputs must come from kernels")
        if ptr not in self._bufs:
            raise Untraceable("a tensor that is neither an input nor allocated inside forward reached a kernel or copy")
        return self._bufs[ptr]

    def _count_values(self, n: int) -> None:
        self._values += n
        if self._values > MAX_PYTHON_VALUES:
            raise Untraceable(f"more than {MAX_PYTHON_VALUES} values written into tensors from Python in one call: "
                              "outputs must come from kernels")

    def _lift(self, t: torch.Tensor) -> None:
        """A tensor made from Python values (`lift_fresh`): integer/bool index data becomes a literal."""
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._bufs or t.numel() == 0:
            return
        if t.dtype not in LITERAL_DTYPES:
            if t.is_floating_point() or t.is_complex():
                self._python_floats.add(ptr)
            return
        if t.storage_offset() or not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return
        self._count_values(t.numel())
        values = [int(v) for v in t.reshape(-1).tolist()]
        self._add({"kind": "literal", "dtype": WIRE_NAMES[t.dtype], "shape": list(t.shape), "values": values,
                   "new": [self._new_buffer(t)]})

    def ref(self, t: torch.Tensor) -> dict[str, Any]:
        """A tensor as a view of a buffer."""
        if t.dtype not in WIRE_NAMES:
            raise Untraceable(f"dtype {t.dtype} is not supported")
        return {"buf": self._buffer_of(t), "offset": t.storage_offset(), "shape": list(t.shape),
                "stride": list(t.stride()), "dtype": WIRE_NAMES[t.dtype]}

    def encode(self, value: Any) -> Any:
        """An aten argument or a kernel argument as JSON."""
        if isinstance(value, torch.Tensor):
            return {"tensor": self.ref(value)}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return {"seq": [self.encode(v) for v in value]}
        if isinstance(value, torch.dtype):
            if value not in WIRE_NAMES:
                raise Untraceable(f"dtype {value} is not supported")
            return {"dtype": WIRE_NAMES[value]}
        if isinstance(value, torch.device):
            return {"device": value.type}
        if isinstance(value, (torch.layout, torch.memory_format)):
            return {"enum": str(value).removeprefix("torch.")}
        raise Untraceable(f"an argument of type {type(value).__name__} cannot be recorded")

    def _add(self, entry: dict[str, Any]) -> None:
        if len(self.entries) >= MAX_ENTRIES:
            raise Untraceable(f"more than {MAX_ENTRIES} recorded operations in one call")
        self.entries.append(entry)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # Under inference_mode (as the engine calls kernels) composite ops (reshape, contiguous, item,
            # flatten, ...) arrive whole: seen through their decomposition, as outside it.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = func.overloadpacket.__name__
        if name not in ALLOWED_ATEN:  # inside a launch too: a kernel body is no place for torch compute
            self.forbidden.append(str(func))
        if self.in_launch:  # Triton's own bookkeeping around a launch (the interpreter copies storages)
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            # A refused allocation counts even when the candidate catches it: probing the limit
            # would tell the judge from a server with more memory.
            self.memory_refused = self.memory_refused or out_of_memory(exc)
            raise
        if name == "lift_fresh" and isinstance(out, torch.Tensor) and self.problem is None:
            try:
                self._lift(out)
            except Untraceable as exc:
                self.problem = str(exc)
        if name in ALLOCATORS:
            for t in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(t, torch.Tensor):
                    poison(t)
        if name in DATA_ATEN and self.problem is None:
            try:
                entry = {"kind": "aten", "op": str(func), "args": self.encode(list(args)),
                         "kwargs": {k: self.encode(v) for k, v in kwargs.items()}}
                news = []
                for t in (out if isinstance(out, (list, tuple)) else [out]):
                    fresh = isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._bufs
                    news.append(self._new_buffer(t) if fresh else None)
                entry["new"] = news
                if name in FILLS:
                    self._count_values(1)
                self._add(entry)
            except Untraceable as exc:
                self.problem = str(exc)
        return out

    def launch(self, kernel: str, args: tuple, kwargs: dict[str, Any], grid: tuple[int, ...]) -> None:
        if self.problem is not None:
            return
        try:
            self._add({"kind": "launch", "kernel": kernel, "grid": list(grid),
                       "args": [self._kernel_arg(a) for a in args],
                       "kwargs": {k: self._kernel_arg(v) for k, v in kwargs.items()}})
        except Untraceable as exc:
            self.problem = str(exc)

    def _kernel_arg(self, value: Any) -> Any:
        import triton.language as tl

        if isinstance(value, torch.Tensor):
            if value.dtype not in WIRE_NAMES:
                raise Untraceable(f"a kernel argument of dtype {value.dtype} is not supported")
            # Not data_ptr(): an empty tensor reports a null data pointer even when it is a slice of a buffer.
            byte_offset = value.storage_offset() * value.element_size()
            return {"ptr": self._buffer_of(value), "byte_offset": byte_offset, "dtype": WIRE_NAMES[value.dtype]}
        if isinstance(value, tl.constexpr):
            return {"constexpr": self._kernel_arg(value.value)}
        if isinstance(value, tl.dtype):
            return {"tl_dtype": value.name}
        if isinstance(value, tuple):
            return {"seq": [self._kernel_arg(v) for v in value]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise Untraceable(f"a kernel argument of type {type(value).__name__} cannot be recorded")

    def launch_bounds(self, kernel: str, names: list[str], args: tuple, kwargs: dict[str, Any]) -> bounds.Launch:
        """What an interpreted launch may touch: the view of each input it is given, the whole storage
        of anything else (an allocation of the call; memory from nowhere, already untraceable)."""
        pointers = []
        for name, t in bounds.named_tensors(names, args, kwargs):
            storage = t.untyped_storage()
            buf = self._bufs.get(storage.data_ptr())
            if buf is None:
                region = bounds.tensor_intervals(t, whole_storage=True)
            elif buf in self._regions:
                region = self._regions[buf]
            elif buf < self.n_inputs:  # inputs sharing a storage (in-process callers) share their views
                views = [bounds.tensor_intervals(x) for x in self._keep[:self.n_inputs]
                         if x.untyped_storage().data_ptr() == storage.data_ptr()]
                region = self._regions[buf] = bounds.merge(np.concatenate([v[0] for v in views]),
                                                           np.concatenate([v[1] for v in views]))
            else:
                region = self._regions[buf] = bounds.tensor_intervals(self._keep[buf], whole_storage=True)
            address = storage.data_ptr() + t.storage_offset() * t.element_size()
            pointers.append((name, address, t.element_size(), region))
        return bounds.Launch(kernel, pointers)

    def finish(self, out: Any) -> dict[str, Any]:
        outs = out if isinstance(out, tuple) else (out,)
        refs = []
        if self.problem is None:
            try:
                refs = [self.ref(o) if type(o) is torch.Tensor else None for o in outs]
            except Untraceable as exc:
                self.problem = str(exc)
        record = {"entries": self.entries, "outputs": refs, "inputs": self.n_inputs, "problem": self.problem}
        self._keep = []
        return record


def resolve_grid(grid: Any, arg_names: list[str], args: tuple, kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The launch grid as three ints (a callable grid gets the named arguments, as Triton does)."""
    if callable(grid):
        meta = dict(zip(arg_names, args))
        meta.update(kwargs)
        grid = grid(meta)
    grid = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    if not 1 <= len(grid) <= 3:
        raise Untraceable(f"a grid of {len(grid)} dimensions")
    return grid + (1,) * (3 - len(grid))


def install_launch_hook(state: dict[str, Any]) -> None:
    """Wrap Triton's launch entry points (compiled and interpreted). `state` holds the active
    Recorder under "recorder" (or None) and counts launches under "launches". Interpreted launches
    are address-checked (kernels/interpreter_bounds.py)."""
    from triton.runtime import interpreter, jit

    bounds.install()
    for cls in (jit.JITFunction, interpreter.InterpretedFunction):
        original = cls.run

        def run(self, *args: Any, _original=original, **kwargs: Any) -> Any:  # noqa: ANN001
            if kwargs.get("warmup"):
                return _original(self, *args, **kwargs)
            recorder = state.get("recorder")
            if recorder is None:
                return _original(self, *args, **kwargs)
            grid = kwargs.pop("grid")
            state["launches"] = state.get("launches", 0) + 1
            names = list(getattr(self, "arg_names", []))
            extra = {k: v for k, v in kwargs.items() if k != "warmup"}
            try:
                resolved = resolve_grid(grid, names, args, extra)
                recorder.launch(self.fn.__name__, args, extra, resolved)
            except Untraceable as exc:
                recorder.problem = recorder.problem or str(exc)
                resolved = grid
            checked = (bounds.checking(recorder.launch_bounds(self.fn.__name__, names, args, extra))
                       if isinstance(self, interpreter.InterpretedFunction) else contextlib.nullcontext())
            recorder.in_launch = True
            try:
                with checked:
                    return _original(self, *args, grid=resolved, **kwargs)
            finally:
                recorder.in_launch = False

        cls.run = run
