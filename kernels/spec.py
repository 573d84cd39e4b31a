"""The op spec: everything the rest of kernelloop needs to know about one op.

One module per op in `kernels/ops/` builds an `OpSpec`. The sandbox judges candidates against it,
the registry buckets shapes with it, the engine dispatches through it and the LLM is prompted
with it, so its fields are a contract (see docs/ARCHITECTURE.md).

Shapes are plain dicts of named sizes (``{"tokens": 7, "hidden": 2880}``) so they travel as JSON.
So do input variants (``{"layout": "strided"}``): how `make_inputs` departs from its default inputs.
`OpSpec.battery(device)` is the op's whole correctness battery: the `Case`s a candidate must pass.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from kernelloop.common.errors import UnknownDtypeError
from kernelloop.kernels.device import Device

Shape = Mapping[str, int]
Variant = Mapping[str, Any]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES_BY_NAME[name]
    except KeyError:
        raise UnknownDtypeError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES_BY_NAME)}") from None


@dataclass(frozen=True)
class Tolerance:
    """Allowed error: |out - expected| <= atol + rtol * |expected|, elementwise."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Cost:
    """What one call must move and compute at minimum: the roofline's numerator."""

    bytes: int
    flops: int

    def roofline_seconds(self, bytes_per_s: float, flops_per_s: float) -> float:
        return max(self.bytes / bytes_per_s, self.flops / flops_per_s)


# One rounding of a float32 result, with room for a different but exact summation order:
# bf16 rtol is two ulps (a GPU kernel may round an intermediate to bf16 once more than the reference).
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1e-2, rtol=1.6e-2),
}

# Unit roundoff u of each dtype (half an ulp, relative): the scale of one correct rounding.
UNIT_ROUNDOFF: Mapping[torch.dtype, float] = {
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


@dataclass(frozen=True)
class ErrorBounds:
    """Bounds on the statistics of an output's error against the reference (kernels/compare.py
    `error_stats`), in units of the output dtype's unit roundoff u. Rounding error is unbiased, so
    its mean shrinks as rows are added, while a systematic bias does not:

    |mean signed relative error| and |mean offset / rms(ref)| <= (bias + spread * s / sqrt(rows)) * u
    relative RMS error                                       <= rms * s * u

    with s the op's `tolerance_scale` at the shape (accumulation depth), 1 for most ops. Rows (all
    but the last dim), not elements: a row's elements may share one rounding (a norm's scale, a
    softmax's probabilities rounded to the dtype), which averages out only over rows."""

    bias: float    # what a correct kernel's order-dependent rounding may leave at any size
    spread: float  # one row's shared rounding: the mean's allowance over r rows is spread / sqrt(r)
    rms: float


# fp32: a few ulps of float32 arithmetic that differ from the reference's (a row's reduction, rsqrt,
# exp), times the accumulation depth; fp16/bf16: one rounding of nearly the reference's float32
# value, or two where a kernel rounds an intermediate to the dtype as GPU kernels do (attention's
# probabilities before the second dot). Every baseline sits within a quarter of these over its whole
# battery (tests/test_battery.py), as do the controls; a bias of a quarter of u is refused over a few
# hundred rows, truncation instead of rounding (~0.7 u) over a few dozen.
DEFAULT_ERROR_BOUNDS: Mapping[torch.dtype, ErrorBounds] = {
    torch.float32: ErrorBounds(bias=8.0, spread=32.0, rms=40.0),
    torch.float16: ErrorBounds(bias=0.1, spread=2.0, rms=3.0),
    torch.bfloat16: ErrorBounds(bias=0.1, spread=2.0, rms=3.0),
}

# Token counts are bucketed by these upper bounds; model dimensions are kept exact.
TOKEN_BUCKETS: tuple[int, ...] = (1, 16, 128, 1024, 8192)


def size_class(n: int) -> int:
    """ceil(log2(n)): a cheap dispatch-cache key; every class lies inside one `size_bucket`."""
    return max(n - 1, 0).bit_length()


def size_range(n: int) -> tuple[int, int | None]:
    """(smallest, largest) size of n's bucket; largest is None for the open last bucket."""
    lo = 1
    for hi in TOKEN_BUCKETS:
        if n <= hi:
            return lo, hi
        lo = hi + 1
    return lo, None


def size_bucket(n: int) -> str:
    """`1`, `2-16`, `17-128`, ... `>8192`: coarse enough that a decode step and a prefill differ."""
    lo, hi = size_range(n)
    if hi is None:
        return f">{TOKEN_BUCKETS[-1]}"
    return str(hi) if lo == hi else f"{lo}-{hi}"


def shape_in_bucket(bucket: str) -> dict[str, int]:
    """A concrete shape inside a bucket that `OpSpec.bucket` wrote: each size range at its top (an open
    range one past its bound), exact sizes as they are."""
    shape = {}
    for part in bucket.split(","):
        key, value = part.split("=", 1)
        shape[key] = int(value[1:]) + 1 if value.startswith(">") else int(value.split("-")[-1])
    return shape


CUDA_ENGINE_SHAPES = 4  # engine shapes in the CUDA battery, spread over decode to prefill

# The engine's ranges, which every op's battery reaches on every device (`OpSpec.range_shapes`): the
# scheduler sends up to TOKEN_BUDGET rows in one forward (its default max_prefill_tokens, checked by
# tests/test_battery.py), and real models' hidden sizes are powers of two and SmolLM2's 576.
TOKEN_BUDGET = 4096
# On CPU a range shape's tokens stop at the low end of the top bucket the engine reaches (1025-8192),
# past every bucket boundary it crosses: a kernel with one program per token pays ~2 ms a token in a
# call and again in its replay, so TOKEN_BUDGET tokens would take most of a candidate's budget. The
# engine never hands a registry kernel more rows than its device's judge checked (`judged_tokens`).
CPU_RANGE_TOKENS = TOKEN_BUCKETS[-2] + 1
REAL_HIDDEN: tuple[int, ...] = (576, 2048, 4096, 8192)


def at_few_rows(key: str, sizes: Sequence[int] = REAL_HIDDEN) -> tuple[dict[str, int], ...]:
    """{"tokens": 1-3, key: size} for each size: real model sizes at decode-like row counts."""
    return tuple({"tokens": 1 + i % 3, key: size} for i, size in enumerate(sizes))


def pick_shapes(shapes: Sequence[Shape], limit: int | None) -> list[Shape]:
    """At most `limit` shapes, evenly spaced over the list (first and last always kept)."""
    n = len(shapes)
    if limit is None or limit <= 0 or limit >= n:
        return list(shapes)
    if limit == 1:
        return [shapes[0]]
    picked = sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})
    return [shapes[i] for i in picked]


@dataclass(frozen=True)
class Case:
    """One correctness case: a shape and an input variant ({} = the default inputs). JSON-able."""

    shape: dict[str, int]
    variant: dict[str, Any] = field(default_factory=dict)


def _first_line(doc: str | None) -> str:
    lines = [line.strip() for line in (doc or "").strip().splitlines()]
    return lines[0] if lines else "scaled with the shape"


def _unique(cases: list[Case]) -> list[Case]:
    seen: set[str] = set()
    out = []
    for c in cases:
        key = json.dumps([c.shape, c.variant], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


@dataclass(frozen=True)
class OpSpec:
    """One op of the library.

    reference:    pure-torch implementation, float32 math, the ground truth.
    forward:      the baseline Triton implementation, same signature as `reference`.
    make_inputs:  (shape, dtype, seed, device, variant=None) -> tuple of positional args; variant
                  None or {} gives the default (LLM-scale) inputs, one of `variants` a departure.
    shape_of:     args -> shape dict (the inverse of make_inputs, for dispatch and profiling).
    dispatch_key: args -> small hashable tuple, cheap (no dict, no device sync): dtype, exact
                  model dims, `size_class` of bucketed sizes. Equal keys must mean equal buckets.
    bucketed:     shape keys bucketed by `size_bucket` (batch-like sizes); the others stay exact.
    cost:         (shape, dtype) -> Cost, the bytes/FLOPs model for roofline figures.
    engine_shapes: shapes a Llama-family engine calls this op with (decode and prefill).
    test_shapes:  small shapes, odd and even, cheap enough for the Triton interpreter.
    held_back:    odd shapes judged but never shown to a proposer (the battery has them).
    variants:     input variants covering the contract (scalars, magnitudes, zero rows, layouts).
    variant_shapes: the small shapes every variant is tried on.
    many_rows:    a shape with many rows and small rows, in the CPU battery (engine shapes on CUDA).
    range_shapes: the engine's ranges, judged on every device after the battery (`range_cases`): real
                  model sizes (REAL_HIDDEN, real head layouts) at few rows, and many rows (TOKEN_BUDGET
                  tokens) at a small model size; attention: long KV at few requests, many requests at
                  short lengths. Costly to interpret for a kernel with one program per row: on CPU
                  each runs in one dtype, its tokens capped (sandbox/judge/plan.py). Cheap cases first.
    cpu_range_tokens: the CPU cap on a range shape's tokens for an op far costlier a token to
                  interpret than most; None: CPU_RANGE_TOKENS (the low end of the top bucket, 1025).
    tolerance_scale: optional (shape, dtype) -> positive factor multiplying a dtype's atol and rtol at that
                  shape (`tolerance(dtype, shape)`), for ops whose legitimate rounding error grows with
                  a dimension (a matmul's float32 accumulation over K); None: tolerances are per dtype
                  only. Its docstring's first line is what `describe()` quotes.
    tf32:         precision policy: True if float32 inputs may be computed with TF32 (10-bit mantissa)
                  on a GPU. False (the default): float32 means IEEE float32 products and sums, and the
                  float32 tolerance is tight enough that a TF32 kernel fails it.
    error_bounds: per dtype, the bounds on the error's statistics (`ErrorBounds`: bias, offset,
                  relative RMS) that an output within the elementwise tolerance must also meet.
    batch_rows:   names of the inputs whose leading dim is the batch's rows (tokens), as are the outputs':
                  row i of the outputs depends only on row i of these and on the other inputs. The batch
                  invariance probe (sandbox/judge/batch_invariance.py) embeds rows among others through them;
                  () where rows are not independent slices (attention: requests own ragged KV).
    """

    name: str
    signature: str
    summary: str
    reference: Callable[..., Any]
    forward: Callable[..., Any]
    make_inputs: Callable[..., tuple]
    shape_of: Callable[..., dict[str, int]]
    dispatch_key: Callable[..., tuple]
    cost: Callable[[Shape, torch.dtype], Cost]
    engine_shapes: tuple[dict[str, int], ...]
    test_shapes: tuple[dict[str, int], ...]
    bucketed: frozenset[str]
    tolerances: Mapping[torch.dtype, Tolerance] = field(default_factory=dict)
    num_outputs: int = 1
    held_back: tuple[dict[str, int], ...] = ()
    variants: tuple[dict[str, Any], ...] = ()
    variant_shapes: tuple[dict[str, int], ...] = ()
    many_rows: dict[str, int] | None = None
    range_shapes: tuple[dict[str, int], ...] = ()
    cpu_range_tokens: int | None = None
    tolerance_scale: Callable[[Shape, torch.dtype], float] | None = None
    tf32: bool = False
    error_bounds: Mapping[torch.dtype, ErrorBounds] = field(default_factory=lambda: DEFAULT_ERROR_BOUNDS)
    batch_rows: tuple[str, ...] = ()

    def battery(self, device: Device) -> list[Case]:
        """The cases a candidate must pass on `device` in each dtype (each seed the judge draws):
        test and held-back shapes (+ many rows on CPU, engine shapes on CUDA) with the default
        inputs, then every variant on every variant shape. The sandbox adds `range_cases`."""
        shapes = list(self.test_shapes) + list(self.held_back)
        if not device.interpreted:
            shapes += pick_shapes(self.engine_shapes, CUDA_ENGINE_SHAPES)
        elif self.many_rows is not None:
            shapes.append(self.many_rows)
        cases = [Case(dict(s)) for s in shapes]
        cases += [Case(dict(s), dict(v)) for v in self.variants for s in self.variant_shapes]
        return _unique(cases)

    def range_cases(self) -> list[Case]:
        """The engine's ranges (`range_shapes`), default inputs: the sandbox checks each in one dtype
        on CPU (every dtype on CUDA), after the battery."""
        return _unique([Case(dict(s)) for s in self.range_shapes])

    def judged_tokens(self, device: Device) -> int:
        """The most tokens (rows) a kernel of this op is judged at on `device`: the scheduler's whole budget on a GPU, the CPU cap on the
        interpreter. The engine sends a registry kernel no more (kernels/dispatch.py)."""
        if device.interpreted:
            return self.cpu_range_tokens or CPU_RANGE_TOKENS
        return TOKEN_BUDGET

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(self.tolerances)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(inspect.signature(self.reference).parameters)

    def bucket(self, shape: Shape) -> str:
        """The registry's shape bucket, e.g. `hidden=4096,tokens=17-128` (keys sorted)."""
        parts = []
        for key in sorted(shape):
            value = shape[key]
            parts.append(f"{key}={size_bucket(value) if key in self.bucketed else value}")
        return ",".join(parts)

    def tolerance(self, dtype: torch.dtype, shape: Shape | None = None) -> Tolerance:
        """The allowed error for `dtype`; at `shape`, scaled by `tolerance_scale` when the op has one."""
        try:
            tol = self.tolerances[dtype]
        except KeyError:
            raise ValueError(f"{self.name} does not support dtype {dtype}") from None
        scale = self.scale_at(dtype, shape)
        return tol if scale == 1.0 else Tolerance(atol=tol.atol * scale, rtol=tol.rtol * scale)

    def scale_at(self, dtype: torch.dtype, shape: Shape | None) -> float:
        """`tolerance_scale` at `shape` (1.0 without one, or without a shape)."""
        if shape is None or self.tolerance_scale is None:
            return 1.0
        scale = float(self.tolerance_scale(shape, dtype))
        if not 0 < scale < math.inf:
            raise ValueError(f"{self.name}: tolerance scale {scale!r} at {dict(shape)} is not a positive number")
        return scale

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: what `agent ops --json` prints and what a prompt quotes."""
        return {
            "name": self.name,
            "signature": self.signature,
            "summary": self.summary,
            "args": list(self.arg_names),
            "dtypes": [dtype_name(d) for d in self.dtypes],
            "tolerances": {dtype_name(d): {"atol": t.atol, "rtol": t.rtol} for d, t in self.tolerances.items()},
            "shape_keys": sorted(self.engine_shapes[0]),
            "bucketed": sorted(self.bucketed),
            "engine_shapes": [dict(s) for s in self.engine_shapes],
            "tolerance_scale": _first_line(self.tolerance_scale.__doc__) if self.tolerance_scale else None,
            "error_bounds": {dtype_name(d): {"bias": b.bias, "spread": b.spread, "rms": b.rms, "u": UNIT_ROUNDOFF[d]}
                             for d, b in self.error_bounds.items() if d in self.tolerances},
            "tf32": self.tf32,
        }
