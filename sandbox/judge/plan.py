"""What to run for one candidate: the correctness trials and the timing calls, with their seeds.

The battery is the op's own (`OpSpec.battery`: test shapes, held-back odd shapes, a many-row shape,
the engine's ranges, and the op's input variants: seeded scalars, magnitudes, zero rows, strided and
3-D layouts), plus any shapes the caller adds (e.g. from an engine profile). Every trial gets its own
seed, drawn from the master seed; by default that is secret (os.urandom), and it never leaves the
judge's process. The first two cases come back at the end with new inputs: a result cached by shape
fails there. The candidate is timed in one of the dtypes it is judged in. A kernel naming a Triton
atomic judged without float32 gets one float32 trial first, judged for races only (`race_dtype_case`).
"""

from __future__ import annotations

import inspect
import random
import secrets
from typing import Any

import torch

from kernelloop.common.errors import UnknownDtypeError
from kernelloop.kernels.device import Device
from kernelloop.kernels.spec import (
    CUDA_ENGINE_SHAPES,
    TOKEN_BUCKETS,
    Cost,
    OpSpec,
    Shape,
    dtype_name,
    parse_dtype,
    pick_shapes,
)
from kernelloop.sandbox.messages import Plan, Timing, Trial
from kernelloop.sandbox.options import CheckOptions

# On CUDA too, every trial's and every timed call's inputs and reference are computed on the judge's
# CPU (sandbox/judge/orchestrator.py). An engine shape costing more than this in float32 would take seconds to
# minutes there per call (linear at 8192 x 128256 x 8192: 17 TFLOPs; an lm_head weight of 10^9
# values), so the default CUDA picks stay within it. The memory-bound ops' largest engine shapes
# (silu_mul at 8192 x 28672: 2.8 GB) are within it: their picks are unchanged. Shapes a caller asks
# for (`CheckOptions.shapes`, `timing_shape`) are not capped on CUDA.
CUDA_TRIAL_LIMIT = Cost(bytes=3_000_000_000, flops=100_000_000_000)

# The CPU interpreter runs a program instance in about a millisecond (rope: 10-20 ms a token), and an
# engine profile's shapes have hundreds of rows: rope at 780 tokens is 9-13 s a call, and a trial is a
# call, its replay and a repeat. So on CPU a caller's shape is checked with each batch-like size at the
# low end of its registry bucket (the same bucket: the same entry, the same code path), at most
# CPU_SIZE_CAP; the model's sizes (hidden, heads, head_dim, ...) stay exact. Timing is 8 rounds of 4
# calls (candidate and baseline, each called and replayed), so a caller's timing shape is cut further,
# to CPU_TIMING_CAP rows: interpreter times describe the interpreter anyway, never a GPU.
CPU_SIZE_CAP = 129  # the low end of the 129-1024 bucket
CPU_TIMING_CAP = 16  # the high end of the 2-16 bucket


def trial_inputs(spec: OpSpec, shape: dict, dtype: str, seed: int, variant: dict) -> tuple:
    """A trial's (or a timed call's) inputs, made on the judge's CPU."""
    if variant and "variant" in inspect.signature(spec.make_inputs).parameters:
        return spec.make_inputs(shape, parse_dtype(dtype), seed, "cpu", variant)
    return spec.make_inputs(shape, parse_dtype(dtype), seed, "cpu")


def master_seed(options: CheckOptions) -> int:
    return options.seed if options.seed is not None else secrets.randbits(62)


def within_trial_limit(spec: OpSpec, shape: Shape) -> bool:
    cost = spec.cost(shape, torch.float32)
    return cost.bytes <= CUDA_TRIAL_LIMIT.bytes and cost.flops <= CUDA_TRIAL_LIMIT.flops


def cuda_engine_shapes(spec: OpSpec, n: int) -> list[dict[str, int]]:
    """n engine shapes spread over decode to prefill (`pick_shapes`); when one of them is over
    CUDA_TRIAL_LIMIT, n spread over the engine shapes within it instead."""
    picked = pick_shapes(spec.engine_shapes, n)
    if not all(within_trial_limit(spec, s) for s in picked):
        picked = pick_shapes([s for s in spec.engine_shapes if within_trial_limit(spec, s)], n)
    return [dict(s) for s in picked]


def bucket_floor(n: int) -> int:
    """The smallest size in n's registry size bucket (kernels.spec.size_bucket); n itself below 1."""
    lo = 1
    for hi in TOKEN_BUCKETS:
        if n <= hi:
            break
        lo = hi + 1
    return min(n, lo)


def interpreter_shape(spec: OpSpec, shape: Shape, cap: int = CPU_SIZE_CAP) -> dict[str, int]:
    """A caller's shape as the CPU plan uses it: batch-like sizes (`spec.bucketed`) at the low end of
    their bucket, at most `cap`; model dimensions (hidden, heads, ...) exact."""
    return {k: min(bucket_floor(v), cap) if k in spec.bucketed else v for k, v in shape.items()}


def check_cases(spec: OpSpec, options: CheckOptions) -> list[tuple[dict[str, int], dict[str, Any]]]:
    """(shape, variant) pairs, without repeats. On CUDA the battery's engine shapes are
    `cuda_engine_shapes` (nothing over CUDA_TRIAL_LIMIT)."""
    cases = [(dict(c.shape), dict(c.variant)) for c in spec.battery(options.device)]
    if not options.device.interpreted:  # the battery's engine picks, replaced where they are over the limit
        battery_picks = pick_shapes(spec.engine_shapes, CUDA_ENGINE_SHAPES)
        picks = cuda_engine_shapes(spec, CUDA_ENGINE_SHAPES)
        cases = [c for c in cases if c[1] or c[0] not in battery_picks or c[0] in picks] + [(s, {}) for s in picks]
    if options.device.interpreted:
        cases += [(interpreter_shape(spec, s), {}) for s in options.shapes]
    else:
        cases += [(dict(s), {}) for s in options.shapes]
    seen, out = set(), []
    for shape, variant in cases:
        key = (tuple(sorted(shape.items())), tuple(sorted(variant.items())))
        if key not in seen:
            seen.add(key)
            out.append((shape, variant))
    return out


def check_dtypes(spec: OpSpec, options: CheckOptions) -> list[str]:
    """The dtypes judged: the op's, or those of `options.dtypes` it supports (at least one)."""
    names = [dtype_name(d) for d in spec.dtypes]
    if options.dtypes:
        for name in options.dtypes:
            parse_dtype(name)  # unknown names raise UnknownDtypeError
        names = [n for n in names if n in options.dtypes]
        if not names:
            raise UnknownDtypeError(f"{spec.name} supports {', '.join(dtype_name(d) for d in spec.dtypes)}; "
                                    f"none of {', '.join(options.dtypes)}")
    return names


def timing_shape(spec: OpSpec, options: CheckOptions) -> dict[str, int]:
    """CPU: the costliest test shape (the interpreter is slow), or the caller's as `interpreter_shape`.
    CUDA: the caller's, else a mid-size engine shape, the middle of three `cuda_engine_shapes`."""
    if options.timing_shape:
        if options.device.interpreted:
            return interpreter_shape(spec, options.timing_shape, CPU_TIMING_CAP)
        return dict(options.timing_shape)
    if not options.device.interpreted:
        return cuda_engine_shapes(spec, 3)[1]
    return costliest_test_shape(spec)


def costliest_test_shape(spec: OpSpec) -> dict[str, int]:
    return dict(max(spec.test_shapes, key=lambda s: spec.cost(s, parse_dtype("float32")).bytes))


def timing_dtype(spec: OpSpec, options: CheckOptions) -> str:
    """One of the dtypes judged (`check_dtypes`): the caller's, else bfloat16 on CUDA and float32 on
    CPU when judged, else the first judged. A candidate is never timed in a dtype it was not judged in."""
    judged = check_dtypes(spec, options)
    if options.timing_dtype:
        parse_dtype(options.timing_dtype)
        if options.timing_dtype not in judged:
            raise UnknownDtypeError(f"timing dtype {options.timing_dtype} is not among the dtypes judged "
                                    f"({', '.join(judged)})")
        return options.timing_dtype
    preferred = "bfloat16" if not options.device.interpreted else "float32"
    return preferred if preferred in judged else judged[0]


def _every_dtype(spec: OpSpec, options: CheckOptions, shape: dict, variant: dict) -> bool:
    """Test and held-back shapes run in every dtype; on the CPU interpreter the costlier rest (input
    variants, the many-row and range shapes, caller shapes) takes turns over the dtypes."""
    if not options.device.interpreted:
        return True
    return not variant and (shape in list(spec.test_shapes) or shape in list(spec.held_back))


def range_cases(spec: OpSpec, options: CheckOptions) -> list[tuple[dict[str, int], dict[str, Any]]]:
    """The op's range cases as the device judges them: at most `spec.judged_tokens(device)` tokens."""
    cap = spec.judged_tokens(options.device)
    return [({**s, "tokens": min(s["tokens"], cap)} if "tokens" in s else s, v)
            for s, v in ((dict(c.shape), dict(c.variant)) for c in spec.range_cases())]


def _repeated(options: CheckOptions, shape: dict, ranges: list) -> bool:
    """Whether a shape's first trial is called twice on the same inputs (same bits?). Not the range
    shapes on CPU, where a call of a one-program-per-row kernel takes seconds: their replay still
    compares the output's bits with a second run of its launches."""
    return not options.device.interpreted or (shape, {}) not in ranges


def race_dtype_case(spec: OpSpec, options: CheckOptions) -> dict[str, int] | None:
    """For a kernel naming a Triton atomic, the shape of one extra float32 trial when float32 is not
    judged but the op supports it: rounding a float atomic's arrival-order sum to bfloat16/float16 can
    give every shuffled order the same bits, so its race shows in float32. The costliest test shape
    (the most programs to shuffle). None where no extra trial is needed or possible."""
    names = [dtype_name(d) for d in spec.dtypes]
    if "float32" not in names or "float32" in check_dtypes(spec, options):
        return None
    return costliest_test_shape(spec)


def make_plan(spec: OpSpec, options: CheckOptions, seed: int, atomics: bool = False) -> Plan:
    """The trials (sandbox/messages.py: Trial) and the timing (Timing, or None without timing).
    `atomics`: the candidate names a Triton atomic (sandbox/inside/program_order.py: uses_atomics); see
    `race_dtype_case`."""
    rng = random.Random(seed)
    cases, dtypes, ranges = check_cases(spec, options), check_dtypes(spec, options), range_cases(spec, options)
    trials: list[Trial] = []
    seen: set[tuple] = set()  # each distinct shape is called twice on the same inputs once: same bits?

    def add(shape: dict[str, int], variant: dict[str, Any], dtype: str) -> None:
        key = tuple(sorted(shape.items()))
        trials.append(Trial(id=len(trials), shape=shape, variant=variant, dtype=dtype, seed=rng.randrange(1 << 62),
                            determinism=key not in seen and _repeated(options, shape, ranges)))
        seen.add(key)

    race_shape = race_dtype_case(spec, options) if atomics else None
    if race_shape is not None:  # first: its bits are raced, its values not judged (float32 was not asked for)
        trials.append(Trial(id=0, shape=race_shape, variant={}, dtype="float32", seed=rng.randrange(1 << 62),
                            determinism=False, race_only=True))
    rotating = [c for c in cases if not _every_dtype(spec, options, *c)]
    turn = random.Random(seed ^ 0x5EED).randrange(len(dtypes))  # which dtype a rotating case lands in: secret too
    for i, dtype in enumerate(dtypes):
        for shape, variant in cases:
            if (shape, variant) in rotating and (rotating.index((shape, variant)) + turn) % len(dtypes) != i:
                continue
            add(shape, variant, dtype)
        for shape, variant in cases[:2]:
            add(shape, variant, dtype)
    # The engine's ranges last (costly to interpret: a kernel wrong elsewhere fails first); one dtype
    # each on CPU.
    for j, (shape, variant) in enumerate(c for c in ranges if c not in cases):
        for i, dtype in enumerate(dtypes):
            if not options.device.interpreted or (j + turn) % len(dtypes) == i:
                add(shape, variant, dtype)
    timing = None
    if options.timing:
        rounds = options.rounds or (15 if not options.device.interpreted else 7)
        calls = 10 if not options.device.interpreted else 3
        seeds = [[rng.randrange(1 << 62) for _ in range(calls)] for _ in range(2 * rounds)]
        timing = Timing(shape=timing_shape(spec, options), dtype=timing_dtype(spec, options), rounds=seeds[:rounds])
        if options.confirm:
            timing["confirm"] = seeds[rounds:]
        if options.timing_shape and timing["shape"] != dict(options.timing_shape):
            timing["asked_shape"] = dict(options.timing_shape)  # cut to the interpreter's scale
    return Plan(trials=trials, timing=timing)


def harness_memory_mb(spec: OpSpec, plan: Plan, device: Device) -> int:
    """Memory a sandboxed process needs for the harness itself, on top of the candidate's allowance:
    each call's tensors arrive over the channel and go back out (inputs and outputs, host copies of
    GPU tensors), and on CUDA the context's own host memory. At GPU timing shapes this is gigabytes
    (silu_mul at 8192 x 28672 moves about 1.4 GB a call), which must not count against the candidate."""
    cases = [(t["shape"], t["dtype"]) for t in plan["trials"]]
    if plan.get("timing"):
        cases.append((plan["timing"]["shape"], plan["timing"]["dtype"]))
    most = max((spec.cost(shape, parse_dtype(dtype)).bytes for shape, dtype in cases), default=0)
    return (3 * most >> 20) + (0 if device.interpreted else 1024)
