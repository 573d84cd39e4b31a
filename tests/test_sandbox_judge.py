"""The judge's decisions, on synthetic facts (no candidate process): each failure code, timing, wire."""

from __future__ import annotations

import pytest
import torch

from kernels.ops import get_op
from sandbox import wire
from sandbox.judge import judge_timing, judge_trial, speedup_interval
from sandbox.options import CheckOptions
from sandbox.plan import HELD_BACK, make_plan
from sandbox.verdict import Verdict

SPEC = get_op("rmsnorm")
TRIAL = {"id": 0, "shape": {"tokens": 3, "hidden": 33}, "dtype": "float32", "seed": 7}
GOOD = {"launches": 1, "torch_ops": [], "violations": [], "devices": ["cpu"], "deterministic": True}


def expected(trial: dict = TRIAL) -> torch.Tensor:
    return SPEC.reference(*SPEC.make_inputs(trial["shape"], torch.float32, trial["seed"], "cpu"))


def judged(facts: dict, outputs: list, trial: dict = TRIAL) -> Verdict:
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")
    judge_trial(v, SPEC, trial, facts, outputs, "cpu")
    return v


def test_right_output_passes() -> None:
    v = judged(GOOD, [expected()])
    assert v.failure is None and v.checks[-1].ok


@pytest.mark.parametrize("facts, outputs, failure", [
    ({**GOOD, "violations": ["write to /etc/x outside the scratch directory"]}, "right", "sandbox-violation"),
    ({**GOOD, "error": "RuntimeError: boom"}, None, "raised"),
    ({**GOOD, "error": "MemoryError", "memory": True}, None, "memory"),
    ({**GOOD, "torch_ops": ["aten.mul.Tensor"]}, "right", "torch-compute"),
    ({**GOOD, "bad_output": "output 0 is list"}, None, "bad-output"),
    ({**GOOD, "aliasing": "output 0 shares memory with input 0"}, "right", "aliasing"),
    ({**GOOD, "input_mutated": "input 0 changed"}, "right", "input-mutated"),
    (GOOD, "nan-row", "mismatch"),
    (GOOD, "wrong-shape", "bad-output"),
    (GOOD, "unknown-dtype", "bad-output"),
    ({**GOOD, "launches": 0}, "right", "no-triton"),
    ({**GOOD, "deterministic": False}, "right", "nondeterministic"),
    ({**GOOD, "devices": ["cuda"]}, "right", "bad-output"),
])
def test_each_failure_is_named(facts: dict, outputs: str | None, failure: str) -> None:
    right = expected()
    out = {"right": [right], None: [], "wrong-shape": [right[:2]], "unknown-dtype": [None]}.get(outputs)
    if outputs == "nan-row":
        out = [right.clone()]
        out[0][-1, -1] = float("nan")  # one element left unwritten by a kernel that misses the tail
    v = judged(facts, out)
    assert v.failure == failure and not v.correct and not v.accepted, v.reason


def test_output_right_with_launches_suppressed_is_launch_independent() -> None:
    trial = {**TRIAL, "suppress": True}
    assert judged(GOOD, [expected()], trial).failure == "launch-independent"
    assert judged(GOOD, [torch.full_like(expected(), float("nan"))], trial).failure is None


def test_first_failure_is_kept() -> None:
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")
    v.fail("mismatch", "first").fail("timeout", "second")
    assert (v.failure, v.reason) == ("mismatch", "first")


def _timing(rounds: int = 7) -> dict:
    return {"shape": {"tokens": 2, "hidden": 64}, "dtype": "float32", "seeds": list(range(rounds)), "calls": 3}


def _timed(base_s: float, cand_s: float, timing: dict, bandwidth: float = 1e9, jitter: float = 0.0) -> Verdict:
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0", correct=True)
    rounds = [{"baseline": [base_s * (1 + jitter * ((i % 3) - 1))] * 3, "candidate": [cand_s] * 3}
              for i in range(len(timing["seeds"]))]
    outs = [SPEC.reference(*SPEC.make_inputs(timing["shape"], torch.float32, s, "cpu")) for s in timing["seeds"]]
    judge_timing(v, SPEC, timing, {"rounds": rounds}, outs, 0.03, bandwidth)
    return v


def test_timing_accepts_a_clear_gain_and_refuses_a_small_one() -> None:
    timing = _timing()
    fast = _timed(2e-3, 1e-3, timing)
    assert fast.accepted and fast.correct and fast.speedup == pytest.approx(2.0)
    same = _timed(1e-3, 1e-3, timing, jitter=0.1)
    assert same.failure == "not-faster" and same.correct and not same.accepted


def test_faster_than_the_roofline_is_impossible() -> None:
    timing = _timing()
    cost = SPEC.cost(timing["shape"], torch.float32).bytes
    v = _timed(1e-3, cost / 1e12, timing, bandwidth=1e9)  # 1 TB/s on a 1 GB/s device
    assert v.failure == "impossible-speedup" and not v.accepted


def test_a_wrong_timed_output_is_a_mismatch() -> None:
    timing = _timing(3)
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0", correct=True)
    rounds = [{"baseline": [1e-3], "candidate": [1e-4]} for _ in range(3)]
    outs = [SPEC.reference(*SPEC.make_inputs(timing["shape"], torch.float32, 0, "cpu"))] * 3  # cached, stale
    judge_timing(v, SPEC, timing, {"rounds": rounds}, outs, 0.03, 1e12)
    assert v.failure == "mismatch" and "timed call" in v.reason


def test_bootstrap_interval() -> None:
    assert speedup_interval([1.2] * 9) == (1.2, 1.2, 1.2)
    median, lo, hi = speedup_interval([0.8, 1.25, 0.9, 1.2, 1.0, 1.1, 0.95])
    assert lo < 1.0 < hi and lo <= median <= hi


def test_plan_uses_secret_seeds_held_back_shapes_and_repeats() -> None:
    a, b = (make_plan(SPEC, CheckOptions(), seed) for seed in (1, 2))
    assert [t["seed"] for t in a["trials"]] != [t["seed"] for t in b["trials"]]
    shapes = [t["shape"] for t in a["trials"]]
    assert all(s in shapes for s in HELD_BACK["rmsnorm"])
    assert len({t["seed"] for t in a["trials"]}) == len(a["trials"])
    first = [t for t in a["trials"] if t["shape"] == SPEC.test_shapes[0] and t["dtype"] == "float32"]
    assert len(first) == 2  # a shape seen twice with different inputs catches results cached by shape
    assert make_plan(SPEC, CheckOptions(timing=False), 1)["timing"] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_wire_round_trip(dtype: torch.dtype) -> None:
    class Pipe:
        def __init__(self) -> None:
            self.frames: list[bytes] = []

        def send_bytes(self, b: bytes) -> None:
            self.frames.append(bytes(b))

        def recv_bytes(self, maxlength: int | None = None) -> bytes:
            return self.frames.pop(0)

    pipe = Pipe()
    t = torch.randn(3, 5).to(dtype)
    wire.send(pipe, {"type": "trial"}, [t, torch.ones(2, dtype=torch.int64)])
    header, tensors = wire.receive(pipe)
    assert header["type"] == "trial" and torch.equal(tensors[0], t) and tensors[1] is None
    wire.send(pipe, {"type": "trial"}, [t])
    pipe.frames[1] = pipe.frames[1][:-2]  # a frame shorter than its header says
    with pytest.raises(wire.ProtocolError):
        wire.receive(pipe)
