"""Inputs drawn ahead of their rows, in worker threads.

Every op's `make_inputs` draws from a seeded CPU generator, one value after another: at engine shapes
that takes seconds (decode_attention's 64-request, 4096-token KV pool is 8e8 values, an lm_head weight
5e8), longer than measuring the row. Workers draw the next rows' inputs on the CPU
(`make_inputs(..., "cpu")`: the same values) while the main thread measures; the main thread moves them
to the device (`to_device`), outside every timed region.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from kernelloop.kernels.spec import OpSpec, Shape

Job = tuple[OpSpec, Shape, torch.dtype]


def default_workers() -> int:
    """Half the cores (the main thread, ptxas and torch's own threads keep the rest), 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def to_device(args: tuple, device: torch.device) -> tuple:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


class InputPrefetcher:
    """`get(i)`: job i's inputs on the CPU, drawn by one of `workers` threads at most `ahead` jobs in
    advance (bounding the memory held); raises what its `make_inputs` raised."""

    def __init__(self, jobs: Sequence[Job], workers: int, ahead: int | None = None) -> None:
        self._jobs = list(jobs)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inputs")
        self._ahead = max(1, ahead if ahead is not None else workers + 2)
        self._futures: dict[int, Future] = {}
        self._submitted = 0
        self._fill(0)

    def _fill(self, current: int) -> None:
        self._submitted = max(self._submitted, current)  # never draw for jobs already passed
        while self._submitted < min(len(self._jobs), current + self._ahead):
            spec, shape, dtype = self._jobs[self._submitted]
            self._futures[self._submitted] = self._pool.submit(spec.make_inputs, shape, dtype, 0, "cpu")
            self._submitted += 1

    def get(self, i: int) -> tuple:
        if i not in self._futures:
            self._fill(i)
        future = self._futures.pop(i)
        try:
            return future.result()
        finally:
            for j in [j for j in self._futures if j < i]:  # skipped jobs free their inputs
                self._futures.pop(j).cancel()
            self._fill(i + 1)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
