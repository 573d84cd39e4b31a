"""The memory of one replayed call (sandbox/inside/replay.py): its buffers, what each launch may touch, and
the guard zones around everything made during the call.

Buffer i is the call's input i (the tensor the judge sent, with its view) or the i-th storage made
during the call, which lives `base` bytes into a larger allocation between two random guard zones
(sandbox/inside/poison.py). Allocations are poisoned with a pattern drawn for each; a storage an op made
(zeros, clone, cat, a literal) is copied into its guarded home.

What a launch may touch (kernels/interpreter_bounds.py, interpreted launches): for an input, the
elements of its view, never its padding or the other parts of a fused buffer; for a buffer made
during the call, that buffer. After the call, `check_guards()` finds stores past (or before) a made
buffer that no address check saw (compiled kernels on a GPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kernelloop.kernels import interpreter_bounds as bounds
from kernelloop.sandbox.inside.poison import Guarded, fill


class Buffers:
    """The buffers of one call: `storage(i)` is (storage, byte offset of the buffer in it, its bytes)."""

    def __init__(self, inputs: list[torch.Tensor], device: torch.device) -> None:
        self.device = device
        self._inputs = list(inputs)
        self._homes: list[tuple[Any, int, int]] = [(t.untyped_storage(), 0, t.untyped_storage().nbytes())
                                                   for t in inputs]
        self._guarded: list[tuple[int, Guarded, str]] = []  # (buffer id, its allocation, the op that made it)
        self._regions: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._index: tuple[int, np.ndarray, np.ndarray] = (0, np.empty(0), np.empty(0))  # (count, starts, order)

    def __len__(self) -> int:
        return len(self._homes)

    def storage(self, buf: int) -> tuple[Any, int, int]:
        return self._homes[buf]

    def make(self, nbytes: int, dtype: torch.dtype, op: str, source: torch.Tensor | None = None) -> int:
        """A new guarded buffer of `nbytes`: a poisoned allocation, or a copy of `source`'s whole storage."""
        guarded = Guarded(nbytes, self.device)
        if source is None:
            fill(guarded.storage, dtype, guarded.base, nbytes)
        elif nbytes:
            raw = torch.empty(0, dtype=torch.uint8, device=self.device)
            raw.set_(guarded.storage, guarded.base, (nbytes,), (1,)).copy_(
                torch.empty(0, dtype=torch.uint8, device=self.device).set_(source.untyped_storage()))
        buf = len(self._homes)
        self._homes.append((guarded.storage, guarded.base, nbytes))
        self._guarded.append((buf, guarded, op))
        return buf

    def region(self, buf: int) -> tuple[np.ndarray, np.ndarray]:
        """The bytes a launch may touch in buffer `buf`."""
        if buf not in self._regions:
            if buf < len(self._inputs):
                self._regions[buf] = bounds.tensor_intervals(self._inputs[buf])
            else:
                storage, base, nbytes = self._homes[buf]
                self._regions[buf] = bounds.span(storage.data_ptr() + base, nbytes)
        return self._regions[buf]

    def launch_bounds(self, kernel: str, names: list[str], args: list, kwargs: dict[str, Any]) -> bounds.Launch:
        """What a launch with these decoded arguments may touch (each pointer is a view into a buffer)."""
        pointers = []
        for name, t in bounds.named_tensors(names, args, kwargs):
            address = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
            buf = self._owner(address)
            pointers.append((name, address, t.element_size(), None if buf is None else self.region(buf)))
        return bounds.Launch(kernel, pointers)

    def _owner(self, address: int) -> int | None:
        """The buffer whose bytes [start, start + nbytes] hold `address` (its end too: an empty slice)."""
        count, starts, order = self._index
        if count != len(self._homes):
            first = np.array([storage.data_ptr() + base for storage, base, _ in self._homes], dtype=np.int64)
            order = np.argsort(first, kind="stable")
            self._index = count, starts, order = len(self._homes), first[order], order
        i = int(np.searchsorted(starts, address, side="right")) - 1
        while i >= 0:  # buffers never overlap, but empty ones may share an address
            buf = int(order[i])
            storage, base, nbytes = self._homes[buf]
            if address <= storage.data_ptr() + base + nbytes:
                return buf
            if nbytes:
                return None
            i -= 1
        return None

    def check_guards(self) -> None:
        """Raise OutOfBounds if a guard zone of a buffer made during the call was written."""
        for buf, guarded, op in self._guarded:
            ok, offset = guarded.intact()
            if not ok:
                raise bounds.OutOfBounds(f"a kernel wrote byte {offset:+d} of buffer {buf}, which has {guarded.nbytes} "
                                         f"bytes (made by {op}): its guard zone changed")
