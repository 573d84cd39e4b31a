"""The judge's decisions on synthetic data (no sandboxed process): each failure code, timing, the plan."""

from __future__ import annotations

import pytest
import torch

from kernelloop.common.stats import median_interval
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.roofline import Rates
from kernelloop.sandbox.judge.decisions import DECIDED, judge_call, judge_replays, judge_timing, next_order
from kernelloop.sandbox.judge.plan import harness_memory_mb, make_plan
from kernelloop.sandbox.options import CheckOptions
from kernelloop.sandbox.verdict import Verdict

SPEC = get_op("rmsnorm")
SHAPE = {"tokens": 3, "hidden": 33}
GOOD = {"launches": 1, "torch_ops": [], "violations": [], "devices": ["cpu"], "count": 1}
RECORD = {"entries": [], "outputs": [{"buf": 2}], "inputs": 2, "problem": None}


def _inputs(seed: int = 7) -> tuple:
    return SPEC.make_inputs(SHAPE, torch.float32, seed, "cpu")


def _verdict() -> Verdict:
    return Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")


def _judged(facts: dict, outputs: list, record: dict = RECORD, after: list | None = None) -> Verdict:
    args = _inputs()
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    v = _verdict()
    judge_call(v, SPEC, "float32 tokens=3,hidden=33", facts, record, outputs,
               after if after is not None else [t.clone() for t in inputs], inputs, SPEC.reference(*args), CPU,
               {"tokens": 3, "hidden": 33})
    return v


def test_right_output_passes() -> None:
    v = _judged(GOOD, [SPEC.reference(*_inputs())])
    assert v.failure is None


@pytest.mark.parametrize("facts, outputs, failure", [
    ({**GOOD, "violations": ["write to /etc/x outside the scratch directory"]}, "right", "sandbox-violation"),
    ({**GOOD, "error": "RuntimeError: boom"}, None, "raised"),
    ({**GOOD, "error": "MemoryError", "memory": True}, None, "memory"),
    ({**GOOD, "torch_ops": ["aten.mul.Tensor"]}, "right", "torch-compute"),
    ({**GOOD, "count": 1, "types": ["list"]}, None, "bad-output"),
    (GOOD, "nan-row", "mismatch"),
    (GOOD, "wrong-shape", "bad-output"),
    ({**GOOD, "launches": 0}, "right", "no-triton"),
    ({**GOOD, "devices": ["cuda"]}, "right", "bad-output"),
    ({"violations": "not a list", "torch_ops": 3, "devices": {"a": 1}}, "right", "no-triton"),  # junk facts
])
def test_each_failure_is_named(facts: dict, outputs: str | None, failure: str) -> None:
    right = SPEC.reference(*_inputs())
    out = {"right": [right], None: [], "wrong-shape": [right[:2]]}.get(outputs)
    if outputs == "nan-row":
        out = [right.clone()]
        out[0][-1, -1] = float("nan")  # one element left unwritten by a kernel that misses the tail
    v = _judged(facts, out)
    assert v.failure == failure and not v.correct and not v.accepted, v.reason


def test_aliasing_mutation_and_untraceable_come_from_the_judges_own_view() -> None:
    right = [SPEC.reference(*_inputs())]
    assert _judged(GOOD, right, {**RECORD, "outputs": [{"buf": 0}]}).failure == "aliasing"
    changed = [t.clone() for t in _inputs() if isinstance(t, torch.Tensor)]
    changed[0][0, 0] += 1
    assert _judged(GOOD, right, after=changed).failure == "input-mutated"
    assert _judged(GOOD, right, {**RECORD, "problem": "memory from nowhere"}).failure == "untraceable"


def test_the_replay_must_give_the_same_bits() -> None:
    out = [torch.randn(3, 4)]
    inputs = [torch.randn(2)]
    ok = _verdict()
    judge_replays(ok, "w", out, [(None, [out[0].clone()])], inputs, [inputs[0].clone()], CPU)
    assert ok.failure is None
    other = _verdict()  # two replays agree with each other, not with what the candidate returned
    judge_replays(other, "w", out, [(None, [out[0] + 1]), (None, [out[0] + 1])], inputs, inputs, CPU)
    assert other.failure == "launch-independent"
    flaky = _verdict()
    judge_replays(flaky, "w", out, [(None, [out[0] + 1]), (None, [out[0] + 2])], inputs, inputs, CPU)
    assert flaky.failure == "nondeterministic"
    nan = torch.full((2,), float("nan"))
    same_nan = _verdict()
    judge_replays(same_nan, "w", [nan], [(7, [nan.clone()])], inputs, inputs, CPU)
    assert same_nan.failure is None  # bitwise: NaN equals NaN
    mutated = _verdict()
    judge_replays(mutated, "w", out, [(7, [out[0].clone()])], inputs, [inputs[0] + 1], CPU)
    assert mutated.failure == "input-mutated"


def test_a_shuffled_order_that_differs_where_grid_order_matches_is_a_race() -> None:
    out = [torch.randn(3, 4)]
    inputs = [torch.randn(2)]
    shuffled = out[0].clone()
    shuffled[1, 2] = torch.nextafter(shuffled[1, 2], torch.tensor(9.0))  # one bit of one element
    race = _verdict()
    judge_replays(race, "w", out, [(7, [shuffled]), (None, [out[0].clone()])], inputs, inputs, CPU)
    assert race.failure == "race" and "seed 7" in race.reason and "1 of 12 elements" in race.reason
    assert "first at [1, 2]" in race.reason, race.reason
    on_gpu = _verdict()
    judge_replays(on_gpu, "w", out, [(7, [shuffled]), (None, [out[0].clone()])], inputs, inputs, CUDA)
    assert on_gpu.failure == "race" and "concurrent load" in on_gpu.reason
    # grid order wrong as well: not a race but what it always was (outside the launches, or flaky)
    outside = _verdict()
    judge_replays(outside, "w", out, [(7, [shuffled]), (None, [shuffled]), (None, [shuffled])], inputs, inputs, CPU)
    assert outside.failure == "launch-independent"
    flaky = _verdict()
    judge_replays(flaky, "w", out, [(7, [shuffled]), (None, [shuffled]), (None, [out[0] + 1])], inputs, inputs, CPU)
    assert flaky.failure == "nondeterministic"


def test_the_replays_asked_for_follow_the_evidence() -> None:
    out = [torch.randn(3, 4)]
    wrong = [out[0] + 1]
    pending = [8, 9]
    # every order matches: the pending orders, then done
    assert next_order(out, [(7, [out[0].clone()])], pending) == 8 and pending == [9]
    assert next_order(out, [(7, out), (8, out)], pending) == 9 and pending == []
    assert next_order(out, [(7, out), (8, out), (9, out)], pending) == DECIDED
    # a shuffled order differs: grid order next; grid order right: decided (a race), pending dropped
    assert next_order(out, [(7, out), (8, wrong)], [9]) is None
    assert next_order(out, [(7, wrong), (None, out)], [9]) == DECIDED
    # grid order wrong too: once more in grid order, then decided
    assert next_order(out, [(7, wrong), (None, wrong)], []) is None
    assert next_order(out, [(7, wrong), (None, wrong), (None, wrong)], []) == DECIDED
    # a timed replay (grid order first)
    assert next_order(out, [(None, wrong)], []) is None
    assert next_order(out, [(None, wrong), (None, out)], []) == DECIDED


def _timed(base_s: float, cand_s: float, bandwidth: float = 1e9, jitter: float = 0.0, rounds: int = 7,
           flops: float = 1e12, spec=SPEC, shape=None) -> Verdict:  # noqa: ANN001
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0", correct=True)
    samples = [{"baseline": [base_s * (1 + jitter * ((i % 3) - 1))] * 3, "candidate": [cand_s] * 3}
               for i in range(rounds)]
    judge_timing(v, spec, shape or {"tokens": 2, "hidden": 64}, torch.float32, samples, 0.03, Rates(bandwidth, flops),
                 "test")
    return v


def test_timing_accepts_a_clear_gain_and_refuses_a_small_one() -> None:
    fast = _timed(2e-3, 1e-3)
    assert fast.accepted and fast.correct and fast.speedup == pytest.approx(2.0)
    same = _timed(1e-3, 1e-3, jitter=0.1)
    assert same.failure == "not-faster" and same.correct and not same.accepted


def test_faster_than_the_roofline_is_impossible() -> None:
    cost = SPEC.cost({"tokens": 2, "hidden": 64}, torch.float32).bytes
    v = _timed(1e-3, cost / 1e12, bandwidth=1e9)  # 1 TB/s on a 1 GB/s device
    assert v.failure == "impossible-speedup" and not v.accepted
    assert v.timing["bound"] == "memory" and v.timing["roofline_fraction"] > 100


def test_a_call_faster_than_the_devices_flops_allow_is_impossible_too() -> None:
    # decode attention at a long context: within the copy bandwidth, but twice the device's FLOP/s
    spec = get_op("decode_attention")
    shape = {"batch": 4, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "kv_len": 4096}
    cost = spec.cost(shape, torch.float32)
    cand_s = cost.flops / 2e9
    rates = Rates(bytes_per_s=100 * cost.bytes / cand_s, flops_per_s=1e9)
    v = _timed(10 * cand_s, cand_s, bandwidth=rates.bytes_per_s, flops=rates.flops_per_s, spec=spec, shape=shape)
    assert v.failure == "impossible-speedup" and "GFLOP" in v.reason
    assert v.timing["bound"] == "compute" and v.timing["roofline_fraction"] == pytest.approx(2.0)
    honest = _timed(10 * cand_s, 4 * cand_s, bandwidth=rates.bytes_per_s, flops=rates.flops_per_s, spec=spec,
                    shape=shape)
    assert honest.accepted and honest.timing["roofline_fraction"] == pytest.approx(0.5)


def test_median_interval_is_order_statistics_with_95_percent_coverage() -> None:
    assert median_interval([1.2] * 9) == (1.2, 1.2, 1.2)
    median, lo, hi = median_interval([0.8, 1.25, 0.9, 1.2, 1.0, 1.1, 0.95])
    assert (median, lo, hi) == (1.0, 0.8, 1.25)  # 7 rounds (the CPU judge): every round behind a claim
    assert median_interval([float(x) for x in range(1, 16)])[1:] == (4.0, 12.0)  # 15 rounds (CUDA)
    assert median_interval([float(x) for x in range(1, 4)])[1:] == (1.0, 3.0)  # 3 rounds (the gate)


@pytest.mark.parametrize("rounds", [7, 15])
def test_an_a_a_comparison_is_claimed_faster_at_most_as_often_as_the_interval_promises(rounds: int) -> None:
    """Same kernel both sides, symmetric noise: the interval's lower bound above 1 is a false claim, and
    must come at most about 2.5% of the time (a bootstrap of the median claimed 6% at 7 rounds)."""
    import random

    rng = random.Random(rounds)
    runs = 4000
    false = sum(median_interval([rng.lognormvariate(0, 0.05) for _ in range(rounds)])[1] > 1.0 for _ in range(runs))
    assert false / runs <= 0.025, false / runs


def test_plan_uses_secret_seeds_the_ops_battery_and_repeats() -> None:
    a, b = (make_plan(SPEC, CheckOptions(), seed) for seed in (1, 2))
    assert [t["seed"] for t in a["trials"]] != [t["seed"] for t in b["trials"]]
    shapes = [t["shape"] for t in a["trials"]]
    assert all(s in shapes for s in SPEC.held_back)
    assert any(t["variant"] for t in a["trials"])
    assert len({t["seed"] for t in a["trials"]}) == len(a["trials"])
    first = [t for t in a["trials"] if t["shape"] == SPEC.test_shapes[0] and t["dtype"] == "float32"
             and not t["variant"]]
    assert len(first) == 2  # a shape seen twice with different inputs catches results cached by shape
    timed = [s for r in a["timing"]["rounds"] for s in r]
    assert len(set(timed)) == len(timed)  # every timed call has inputs of its own
    assert make_plan(SPEC, CheckOptions(timing=False), 1)["timing"] is None


def test_the_harness_memory_grows_with_the_planned_shapes_not_against_the_candidate() -> None:
    """At a GPU timing shape the harness itself holds gigabytes (the call's tensors both ways, host
    copies): that is added to the candidate's allowance instead of being charged to it."""
    silu = get_op("silu_mul")
    small = make_plan(silu, CheckOptions(), 1)
    big = make_plan(silu, CheckOptions(device="cuda", timing_shape={"tokens": 8192, "d": 28672},
                                       timing_dtype="bfloat16"), 1)
    assert harness_memory_mb(silu, small, CPU) < 16
    # at least the timing call: inputs 8192 x 57344 bf16 (940 MB) + output (470 MB), three times over,
    # plus the CUDA context (the CUDA battery's fp32 engine shapes can need more)
    assert harness_memory_mb(silu, big, CUDA) > 3 * 1400 + 1024
