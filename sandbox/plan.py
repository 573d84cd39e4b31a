"""What to run for one candidate: the correctness trials and the timing rounds, with their seeds.

Shapes: the op's own test shapes, the held-back shapes below (never shown to a proposer: odd
sizes, a single row, ragged tails), any shapes the caller adds (e.g. from an engine profile), and
on CUDA a spread of the op's engine shapes. Every (shape, dtype) gets its own seed, drawn from the
master seed; by default that is secret (os.urandom), so a candidate cannot know its inputs.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

from kernels.spec import OpSpec, dtype_name, parse_dtype, pick_shapes
from sandbox.options import CheckOptions

HELD_BACK: dict[str, tuple[dict[str, int], ...]] = {
    "rmsnorm": ({"tokens": 1, "hidden": 1}, {"tokens": 7, "hidden": 257}, {"tokens": 2, "hidden": 4097},
                {"tokens": 9, "hidden": 96}),
    "fused_add_rmsnorm": ({"tokens": 1, "hidden": 1}, {"tokens": 7, "hidden": 257}, {"tokens": 2, "hidden": 4097},
                          {"tokens": 9, "hidden": 96}),
    "silu_mul": ({"tokens": 1, "d": 1}, {"tokens": 7, "d": 129}, {"tokens": 3, "d": 1025}, {"tokens": 9, "d": 96}),
    "rope": ({"tokens": 1, "q_heads": 1, "kv_heads": 1, "head_dim": 2},
             {"tokens": 7, "q_heads": 6, "kv_heads": 2, "head_dim": 96},
             {"tokens": 3, "q_heads": 3, "kv_heads": 3, "head_dim": 34}),
    "decode_attention": ({"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 16, "kv_len": 1},
                         {"batch": 5, "q_heads": 3, "kv_heads": 1, "head_dim": 40, "kv_len": 65},
                         {"batch": 2, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "kv_len": 129}),
}
CUDA_ENGINE_SHAPES = 4  # engine shapes checked on CUDA, spread over decode to prefill


def _unique(shapes: list[dict[str, int]]) -> list[dict[str, int]]:
    seen, out = set(), []
    for s in shapes:
        key = tuple(sorted(s.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(s))
    return out


def master_seed(options: CheckOptions) -> int:
    return options.seed if options.seed is not None else secrets.randbits(62)


def check_shapes(spec: OpSpec, options: CheckOptions) -> list[dict[str, int]]:
    shapes = list(spec.test_shapes) + list(HELD_BACK.get(spec.name, ())) + [dict(s) for s in options.shapes]
    if options.device == "cuda":
        shapes += pick_shapes(spec.engine_shapes, CUDA_ENGINE_SHAPES)
    return _unique(shapes)


def check_dtypes(spec: OpSpec, options: CheckOptions) -> list[str]:
    names = [dtype_name(d) for d in spec.dtypes]
    if options.dtypes:
        for name in options.dtypes:
            parse_dtype(name)  # unknown names raise UnknownDtypeError
        names = [n for n in names if n in options.dtypes]
    return names


def timing_shape(spec: OpSpec, options: CheckOptions) -> dict[str, int]:
    """CPU: the costliest test shape (the interpreter is slow). CUDA: a mid-size engine shape."""
    if options.timing_shape:
        return dict(options.timing_shape)
    if options.device == "cuda":
        return dict(pick_shapes(spec.engine_shapes, 3)[1])
    return dict(max(spec.test_shapes, key=lambda s: spec.cost(s, parse_dtype("float32")).bytes))


def timing_dtype(spec: OpSpec, options: CheckOptions) -> str:
    names = [dtype_name(d) for d in spec.dtypes]
    if options.timing_dtype:
        parse_dtype(options.timing_dtype)
        return options.timing_dtype
    preferred = "bfloat16" if options.device == "cuda" else "float32"
    return preferred if preferred in names else names[0]


def make_plan(spec: OpSpec, options: CheckOptions, seed: int) -> dict[str, Any]:
    """trials: [{id, shape, dtype, seed, determinism, suppress}], timing: {...} or None."""
    rng = random.Random(seed)
    shapes, dtypes = check_shapes(spec, options), check_dtypes(spec, options)
    trials: list[dict[str, Any]] = []
    for dtype in dtypes:
        # The first two shapes come back with new inputs at the end: a result cached by shape fails there.
        for i, shape in enumerate(shapes + shapes[:2]):
            trials.append({"id": len(trials), "shape": shape, "dtype": dtype, "seed": rng.randrange(1 << 62),
                           "determinism": i in (0, len(shapes) - 1), "suppress": False})
    # One more call of a multi-row shape with every Triton launch suppressed: must not come out right.
    probe = max(shapes[: len(spec.test_shapes)], key=lambda s: sum(s.values()))
    trials.append({"id": len(trials), "shape": probe, "dtype": dtypes[0], "seed": rng.randrange(1 << 62),
                   "determinism": False, "suppress": True})
    timing = None
    if options.timing:
        rounds = options.rounds or (15 if options.device == "cuda" else 7)
        timing = {"shape": timing_shape(spec, options), "dtype": timing_dtype(spec, options),
                  "seeds": [rng.randrange(1 << 62) for _ in range(rounds)],
                  "calls": 20 if options.device == "cuda" else 5}
    return {"trials": trials, "timing": timing}
