"""The order a replay runs a launch's programs in: how the judge looks for races (failure `race`).

A replay given an order seed runs every launch so that programs meet in another order than the
runner's: on the CPU interpreter the grid's programs run in a shuffled order drawn from the seed
(kernels/interpreter_order.py); on CUDA, where the hardware schedules programs, the launches run
beside a concurrent load on another stream (matmuls, their count drawn from the seed), which
changes which programs run together and which finish first. A kernel whose bits change is racing:
a program reads another's output, or floating-point atomics add up in arrival order.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from kernelloop.kernels.interpreter_order import shuffled_programs

LOAD_SIDE = 2048  # the concurrent matmuls' size: long enough to share the SMs for every launch of a call


@contextlib.contextmanager
def beside_load(seed: int, device: torch.device) -> Iterator[None]:
    """CUDA: the body's launches run while another stream multiplies matrices."""
    side = torch.cuda.Stream(device=device)
    a = torch.ones((LOAD_SIDE, LOAD_SIDE), device=device, dtype=torch.float16)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2 + seed % 7):
            a = a @ a * 0.0 + 1.0
    try:
        yield
    finally:
        torch.cuda.synchronize(device)


def program_order(order: int | None, device: torch.device) -> contextlib.AbstractContextManager:
    """The context a replay's launches run in: grid order (None), or the order `order` seeds."""
    if order is None:
        return contextlib.nullcontext()
    if device.type == "cuda":
        return beside_load(order, device)
    return shuffled_programs(order)


ATOMIC_ORDERS = 3  # shuffled orders per call for kernels with atomics: their sums follow arrival order


def uses_atomics(source: str | None) -> bool:
    """Whether the candidate's canonical text names a Triton atomic (`tl.atomic_add`, ...)."""
    import ast

    from kernelloop.kernels.candidate.canonical import CanonicalError, canonical

    if source is None:
        return False
    try:
        tree = canonical(source).tree
    except CanonicalError:
        return False
    return any(isinstance(node, ast.Attribute) and node.attr.startswith("atomic_") for node in ast.walk(tree))


def race_orders(seed: int, atomics: bool) -> tuple[int, ...]:
    """The orders a battery call is replayed in, drawn from its trial's seed: one, several with atomics.
    Hashed, so an order seed shown in a verdict tells nothing about the trial's (secret) input seed."""
    import hashlib

    def order(i: int) -> int:
        digest = hashlib.blake2b(f"program order {seed} {i}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "little") & 0x7FFFFFFF

    return tuple(order(i) for i in range(ATOMIC_ORDERS if atomics else 1))
