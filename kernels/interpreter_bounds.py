"""Address checks for Triton's CPU interpreter: every load and store of a launch, against the memory
the launch was given.

The interpreter dereferences raw addresses and checks none of them: an out-of-bounds load reads
whatever lies there (a fault or garbage on a GPU), an out-of-bounds store corrupts the heap. With
`install()` done, a launch run inside `checking(launch)` has every access checked before it happens:
the enabled lanes (masked-off lanes excluded) of `create_masked_load`/`create_masked_store` (plain,
atomic-load/store and tensor-descriptor accesses all go through them), `create_atomic_rmw` and
`create_atomic_cas`, each element's full width, against `Launch.regions`: for a call's input, the
elements of its view (not the padding of a strided view, not the rest of a fused buffer); for
memory allocated during the call, that allocation. The first bad access is kept in
`Launch.violation` and raised as `OutOfBounds`; the caller raises it again after the launch, since
the interpreter wraps a kernel's exceptions. Checks are numpy-vectorised: a min/max test against one
interval first, a sorted-interval search only when that fails.

Used by the sandbox (trace.py in the runner, replay.py in the replayer); the engine never checks.
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import math
from typing import Any, Iterator

import numpy as np

Region = tuple[np.ndarray, np.ndarray]  # sorted, disjoint byte intervals: (starts, ends)
MAX_RUNS = 1 << 20  # intervals one view may describe; a view with more is allowed its whole extent


class OutOfBounds(Exception):
    """A kernel touched memory outside what its launch was given."""


MARK = f"{OutOfBounds.__name__}: "  # how the judge recognises this failure in a one-line error


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint [start, end) byte intervals covering the given ones (adjacent ones joined)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size <= 1:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.empty(starts.size, dtype=bool)
    first[0] = True
    first[1:] = starts[1:] > reach[:-1]
    at = np.flatnonzero(first)
    return starts[at], np.maximum.reduceat(ends, at)


def span(address: int, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """One allocation: [address, address + nbytes)."""
    return np.array([address], dtype=np.int64), np.array([address + nbytes], dtype=np.int64)


def view_intervals(address: int, itemsize: int, shape: list[int], stride: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of a strided view whose element 0 is at `address`: runs of contiguous elements."""
    if math.prod(shape) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1 and st != 0)
    run = 1
    while dims and dims[0][0] == run:  # innermost dimensions that are contiguous make one run
        run *= dims.pop(0)[1]
    count = math.prod(n for _, n in dims)
    if count > MAX_RUNS:  # a huge gappy view: its extent, gaps included
        last = sum((n - 1) * st for st, n in dims) + run
        return span(address, last * itemsize)
    offsets = np.zeros(1, dtype=np.int64)
    for st, n in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * st).reshape(-1)
    starts = address + offsets * itemsize
    return merge(starts, starts + run * itemsize)


def tensor_intervals(t: Any, whole_storage: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A torch tensor's view (or its whole storage) as byte intervals."""
    storage = t.untyped_storage()
    if whole_storage:
        return span(storage.data_ptr(), storage.nbytes())
    address = storage.data_ptr() + t.storage_offset() * t.element_size()
    return view_intervals(address, t.element_size(), list(t.shape), list(t.stride()))


class Launch:
    """The memory one launch may touch, and what to call it in a report.

    `pointers`: (argument name, address it points at, element size, region) for every pointer
    argument, the region being the byte intervals, (starts, ends), of the buffer it belongs to (None:
    a pointer into no known buffer). `violation`: the first refused access, once there is one."""

    def __init__(self, kernel: str, pointers: list[tuple[str, int, int, Region | None]]) -> None:
        self.kernel, self.pointers, self.violation = kernel, pointers, None
        regions = [r for *_, r in pointers if r is not None]
        empty = np.empty(0, dtype=np.int64)
        starts = np.concatenate([s for s, _ in regions]) if regions else empty
        ends = np.concatenate([e for _, e in regions]) if regions else empty
        self.starts, self.ends = merge(starts.astype(np.int64), ends.astype(np.int64))
        self._starts, self._ends = self.starts.tolist(), self.ends.tolist()  # Python ints: fast scalar search
        self._start_u64 = [np.uint64(v) for v in self._starts]
        self._rooms: dict[tuple[int, int], Any] = {}

    def check(self, ptrs: Any, mask: Any, kind: str) -> None:
        """Raise OutOfBounds unless every enabled lane of `ptrs` (a TensorHandle of pointers) is inside.

        Fast path (a few numpy operations): every enabled lane inside the interval of the first lane."""
        addrs = ptrs.data
        if addrs.dtype != np.uint64:
            addrs = np.asarray(addrs).astype(np.uint64)
        if addrs.size == 0:
            return
        enabled = None
        if mask is not None:
            enabled = np.asarray(mask.data, dtype=bool)
            if enabled.shape != addrs.shape:
                enabled = np.broadcast_to(enabled, addrs.shape)
        width = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        i = bisect.bisect_right(self._starts, int(addrs.flat[0])) - 1
        room = self._room(i, width) if i >= 0 else None
        if room is not None:
            outside = np.subtract(addrs, self._start_u64[i]) > room  # below the start wraps around: outside
            if enabled is not None:
                outside &= enabled
            if not outside.any():
                return
        self._check_each(addrs if enabled is None else addrs[enabled], width, kind)

    def _room(self, i: int, width: int) -> Any:
        """The largest offset from interval i's start at which an access of `width` bytes fits (uint64), or
        None if none does."""
        key = (i, width)
        if key not in self._rooms:
            length = self._ends[i] - self._starts[i]
            self._rooms[key] = np.uint64(length - width) if length >= width else None
        return self._rooms[key]

    def _check_each(self, addrs: np.ndarray, width: int, kind: str) -> None:
        """Every lane against every interval (sorted search); raise at the first lane outside."""
        if addrs.size == 0:
            return
        a = addrs.reshape(-1).view(np.int64)  # past 2**63: negative, outside
        starts, ends = self.starts, self.ends
        idx = np.searchsorted(starts, a, side="right") - 1
        end = ends[np.maximum(idx, 0)] if ends.size else np.zeros_like(a)
        ok = (idx >= 0) & (a < end) & (a + width <= end)
        if ok.all():
            return
        self.violation = self.describe(int(a[np.argmin(ok)]), width, kind)
        raise OutOfBounds(self.violation)

    def describe(self, address: int, width: int, kind: str) -> str:
        """The bad access as `kernel k: store to y_ptr[+1024] (4 bytes), outside ...`, named after the
        pointer argument whose buffer lies nearest."""
        def distance(pointer: tuple) -> tuple[int, int]:
            region = pointer[3]
            if region is None or region[0].size == 0:
                return (1 << 64, abs(address - pointer[1]))
            lo, hi = int(region[0][0]), int(region[1][-1])
            return (max(lo - address, address - hi + 1, 0), abs(address - pointer[1]))

        if not self.pointers:
            return f"kernel {self.kernel}: {kind} address {address:#x} ({width} bytes), but it was given no tensor"
        name, base, itemsize, _ = min(self.pointers, key=distance)
        delta = address - base
        where = f"{name}[{delta // itemsize:+d}]" if delta % itemsize == 0 else f"{name} {delta:+d} bytes"
        return f"kernel {self.kernel}: {kind} {where} ({width} bytes), outside the memory passed to the launch"


_ACTIVE: list[Launch] = []  # the launch being checked (at most one: sandbox processes are single-threaded)


@contextlib.contextmanager
def checking(launch: Launch) -> Iterator[Launch]:
    """Check every access of the interpreted launches inside the block against `launch`; after the
    block, raise OutOfBounds if one was refused (whatever the interpreter turned it into)."""
    _ACTIVE.append(launch)
    try:
        yield launch
    except Exception:
        if launch.violation is None:
            raise
    finally:
        _ACTIVE.remove(launch)
    if launch.violation is not None:
        raise OutOfBounds(launch.violation)


# The interpreter's memory entry points, as each supported Triton spells them (3.6: cache_modifier and
# eviction_policy; 3.7 on: cache_policy). Every load and store the interpreter does (plain, block-pointer,
# tensor-descriptor) funnels into these four; the wrappers below read only the leading arguments, which
# every listed signature shares, and pass the rest through unchanged.
_EXPECTED = {
    "create_masked_load": (["self", "ptrs", "mask", "other", "cache_policy", "is_volatile"],
                           ["self", "ptrs", "mask", "other", "cache_modifier", "eviction_policy", "is_volatile"]),
    "create_masked_store": (["self", "ptrs", "value", "mask", "cache_policy"],
                            ["self", "ptrs", "value", "mask", "cache_modifier", "eviction_policy"]),
    "create_atomic_rmw": (["self", "rmwOp", "ptr", "val", "mask", "sem", "scope"],),
    "create_atomic_cas": (["self", "ptr", "cmp", "val", "sem", "scope"],),
}
_INSTALLED: list[bool] = []


def install() -> None:
    """Wrap the interpreter's memory entry points (once). Raises RuntimeError on a Triton whose
    interpreter is not as expected: the sandbox must not run unchecked believing it is checked."""
    if _INSTALLED:
        return
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    for name, known in _EXPECTED.items():
        if list(inspect.signature(getattr(builder, name)).parameters) not in [list(k) for k in known]:
            raise RuntimeError(f"Triton's interpreter changed: InterpreterBuilder.{name} has an unexpected signature")
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def create_masked_load(self, ptrs, mask, *rest, **kwargs):  # noqa: ANN001, ANN202
        if _ACTIVE:
            _ACTIVE[-1].check(ptrs, mask, "load from")
        return load(self, ptrs, mask, *rest, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *rest, **kwargs):  # noqa: ANN001, ANN202
        if _ACTIVE:
            _ACTIVE[-1].check(ptrs, mask, "store to")
        return store(self, ptrs, value, mask, *rest, **kwargs)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, *rest, **kwargs):  # noqa: ANN001, ANN202, N803
        if _ACTIVE:
            _ACTIVE[-1].check(ptr, mask, "atomic on")
        return rmw(self, rmwOp, ptr, val, mask, *rest, **kwargs)

    def create_atomic_cas(self, ptr, cmp, val, *rest, **kwargs):  # noqa: ANN001, ANN202
        if _ACTIVE:
            _ACTIVE[-1].check(ptr, None, "atomic on")
        return cas(self, ptr, cmp, val, *rest, **kwargs)

    for fn in (create_masked_load, create_masked_store, create_atomic_rmw, create_atomic_cas):
        setattr(builder, fn.__name__, fn)
    _INSTALLED.append(True)


def named_tensors(names: list[str], args: tuple | list, kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(argument name, tensor) for every tensor argument of a launch, inside tuples too (`name[i]`)."""
    import torch

    def walk(name: str, value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                yield from walk(f"{name}[{i}]", item)

    for i, value in enumerate(args):
        yield from walk(names[i] if i < len(names) else f"arg{i}", value)
    for key, value in kwargs.items():
        yield from walk(str(key), value)
