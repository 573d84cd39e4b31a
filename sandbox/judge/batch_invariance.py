"""Batch invariance, a property of a kernel: does a row's result depend on the batch it is computed in?

A probe row is computed alone (a batch of one) and then embedded among seeded filler rows in batches
of other sizes, at other places, both drawn from the judge's secret seed (`draw_batches`); the probe
row's outputs must have the same bits every time. A kernel whose reduction order follows the number of
rows (a split along K for few rows, a tile size picked by row count) fails it while being correct at
every shape of the battery.

It is a property, not a failure: the judge records it in the verdict (`batch_invariant`, with
`invariance_reason`) of a correct candidate, the registry entry keeps it, and `engine serve
--deterministic` serves only variants that have it (kernels/deterministic.py). Ops whose rows are not
independent slices of their inputs (`OpSpec.batch_rows` empty: attention) are not probed here.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple, Sequence

import torch

from kernelloop.kernels import interpreter_autotune
from kernelloop.kernels.device import Device
from kernelloop.kernels.spec import OpSpec, dtype_name
from kernelloop.sandbox.judge.decisions import same_bits
from kernelloop.sandbox.judge.plan import trial_inputs

# The probe's batch sizes are drawn from the judge's secret seed, one from each stratum (CPU: few rows,
# the interpreter runs a program per row in ~1 ms; CUDA: more), at a drawn position: a kernel invariant
# only at sizes it could guess is caught. The strata follow the M buckets real GEMM configurations switch
# at (8, 16, 32, 64, 256), so a kernel whose reduction changes with its row count's bucket shows it at
# every seed; one that changes at a single row count inside a stratum, at some seeds.
CPU_STRATA: tuple[tuple[int, int], ...] = ((2, 8), (9, 16), (17, 32), (33, 40))
CUDA_STRATA: tuple[tuple[int, int], ...] = ((2, 16), (17, 32), (33, 64), (65, 256), (257, 300))


class Invariance(NamedTuple):
    invariant: bool | None  # None: not probed (the op has no independent rows)
    reason: str


def draw_batches(seed: int, device: Device) -> tuple[tuple[int, int], ...]:
    """(batch size, where the probe row sits) for each stratum of the device, drawn from `seed`."""
    rng = random.Random(seed ^ 0xBA7C4)
    sizes = [rng.randint(lo, hi) for lo, hi in (CPU_STRATA if device.interpreted else CUDA_STRATA)]
    return tuple((size, rng.randrange(size)) for size in sizes)


def probe_dtype(spec: OpSpec, device: Device) -> str:
    """float32 on the interpreter; bfloat16 (the engine's) on a GPU where the op supports it."""
    names = [dtype_name(d) for d in spec.dtypes]
    if not device.interpreted and "bfloat16" in names:
        return "bfloat16"
    return "float32" if "float32" in names else names[0]


def _embed(spec: OpSpec, row: tuple, filler: tuple, at: int) -> tuple:
    """`filler` with row `at` of every row input replaced by the probe's row; other inputs the probe's."""
    args = []
    for name, mine, theirs in zip(spec.arg_names, row, filler):
        if name in spec.batch_rows:
            batch = theirs.clone()
            batch[at:at + 1] = mine[:1]
            args.append(batch)
        else:
            args.append(mine)
    return tuple(args)


def _first_difference(alone: torch.Tensor, inside: torch.Tensor) -> str:
    if alone.shape != inside.shape or alone.dtype != inside.dtype:
        return f"shape/dtype {tuple(alone.shape)} {alone.dtype} alone, {tuple(inside.shape)} {inside.dtype} in the batch"
    diff = (alone.float() != inside.float()) & ~(alone.float().isnan() & inside.float().isnan())
    where = diff.nonzero()
    if where.numel() == 0:  # same values, other bits (-0.0, NaN payloads)
        return "the same values with other bits"
    i = tuple(where[0].tolist())
    return f"element {i}: {alone[i].item()!r} alone, {inside[i].item()!r} in the batch"


def probe(spec: OpSpec, impl: Callable[..., Any], device: Device, seed: int,
          batches: Sequence[tuple[int, int]] | None = None) -> Invariance:
    """Compute one seeded probe row alone and inside each batch of `batches` ((size, position); None:
    `draw_batches(seed, device)`), with seeded filler rows, and compare its outputs' bits. `impl(*args)`
    returns the op's output(s) (the forward itself, or a call into the sandboxed runner); inputs are made on the CPU
    as the judge makes them. Restores the interpreter's autotune pin (kernels/interpreter_autotune.py):
    the probe runs with the device's own choice, as the engine serves."""
    if not spec.batch_rows:
        return Invariance(None, f"not probed: {spec.name} has no independent rows")
    batches = batches or draw_batches(seed, device)
    dtype = probe_dtype(spec, device)
    shape = dict(spec.test_shapes[0])
    saved = interpreter_autotune.pinned()
    interpreter_autotune.pin(None)
    try:
        row = trial_inputs(spec, {**shape, "tokens": 1}, dtype, seed, {})
        alone = _outputs(impl(*row))
        for i, (size, at) in enumerate(batches):
            filler = trial_inputs(spec, {**shape, "tokens": size}, dtype, seed + 1 + i, {})
            inside = _outputs(impl(*_embed(spec, row, filler, at)))
            for k, (a, b) in enumerate(zip(alone, inside)):
                b = b[at:at + 1]
                if not same_bits(a.cpu(), b.cpu()):
                    return Invariance(False, f"row {at} of a batch of {size} differs from the row alone "
                                             f"({dtype}, output {k}, {_first_difference(a.cpu(), b.cpu())})")
    finally:
        interpreter_autotune.pin(saved)
    sizes = ", ".join(str(size) for size, _ in batches)
    return Invariance(True, f"identical bits alone and in batches of {sizes} ({dtype})")


def _outputs(out: Any) -> list[torch.Tensor]:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise TypeError("the op returned something other than tensors")
    return outs
