"""The op spec: everything the rest of kernelloop needs to know about one op.

One module per op in `kernels/ops/` builds an `OpSpec`. The sandbox judges candidates against it,
the registry buckets shapes with it, the engine dispatches through it and the LLM is prompted
with it, so its fields are a contract (see docs/ARCHITECTURE.md).

Shapes are plain dicts of named sizes (``{"tokens": 7, "hidden": 2880}``) so they travel as JSON.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from kernels.errors import UnknownDtypeError

Shape = Mapping[str, int]

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
# bf16 rtol is two ulps (the Triton interpreter truncates float->bf16 instead of rounding).
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1e-2, rtol=1.6e-2),
}

# Token counts are bucketed by these upper bounds; model dimensions are kept exact.
TOKEN_BUCKETS: tuple[int, ...] = (1, 16, 128, 1024, 8192)


def size_class(n: int) -> int:
    """ceil(log2(n)): a cheap dispatch-cache key; every class lies inside one `size_bucket`."""
    return max(n - 1, 0).bit_length()


def size_bucket(n: int) -> str:
    """`1`, `2-16`, `17-128`, ... `>8192`: coarse enough that a decode step and a prefill differ."""
    lo = 1
    for hi in TOKEN_BUCKETS:
        if n <= hi:
            return str(hi) if lo == hi else f"{lo}-{hi}"
        lo = hi + 1
    return f">{TOKEN_BUCKETS[-1]}"


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
class OpSpec:
    """One op of the library.

    reference:    pure-torch implementation, float32 math, the ground truth.
    forward:      the baseline Triton implementation, same signature as `reference`.
    make_inputs:  (shape, dtype, seed, device) -> tuple of positional args, LLM-scale values.
    shape_of:     args -> shape dict (the inverse of make_inputs, for dispatch and profiling).
    dispatch_key: args -> small hashable tuple, cheap (no dict, no device sync): dtype, exact
                  model dims, `size_class` of bucketed sizes. Equal keys must mean equal buckets.
    bucketed:     shape keys bucketed by `size_bucket` (batch-like sizes); the others stay exact.
    cost:         (shape, dtype) -> Cost, the bytes/FLOPs model for roofline figures.
    engine_shapes: shapes a Llama-family engine calls this op with (decode and prefill).
    test_shapes:  small shapes, odd and even, cheap enough for the Triton interpreter.
    """

    name: str
    signature: str
    summary: str
    reference: Callable[..., Any]
    forward: Callable[..., Any]
    make_inputs: Callable[[Shape, torch.dtype, int, str], tuple]
    shape_of: Callable[..., dict[str, int]]
    dispatch_key: Callable[..., tuple]
    cost: Callable[[Shape, torch.dtype], Cost]
    engine_shapes: tuple[dict[str, int], ...]
    test_shapes: tuple[dict[str, int], ...]
    bucketed: frozenset[str]
    tolerances: Mapping[torch.dtype, Tolerance] = field(default_factory=dict)
    num_outputs: int = 1

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

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        try:
            return self.tolerances[dtype]
        except KeyError:
            raise ValueError(f"{self.name} does not support dtype {dtype}") from None

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
        }
