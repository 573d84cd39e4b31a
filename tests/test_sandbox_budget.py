"""A candidate's time budget: per-device defaults, the split between correctness and
timing, a correct candidate cut off while timed, and the CPU plan's shapes at the interpreter's scale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelloop.history.queries import outcome
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import OPS, get_op
from kernelloop.kernels.spec import dtype_name
from kernelloop.sandbox import FAILURES, CheckOptions, Sandbox, Verdict
from kernelloop.sandbox.judge.budget import Budget, timeout_s
from kernelloop.sandbox.judge.plan import (
    CPU_SIZE_CAP,
    CPU_TIMING_CAP,
    check_cases,
    interpreter_shape,
    make_plan,
    range_cases,
)

REPO = Path(__file__).resolve().parents[1]
HONEST = (REPO / "tests" / "sandbox_candidates" / "control_rmsnorm_row.py").read_text()
# Honest, but at hidden=999 (the timing shape the test asks for, never in the battery) it also runs
# 200000 trivial programs: seconds a call and as much a replay in the interpreter (whose speed varies
# by almost 10x with the machine and its packages), so 7 rounds cannot fit in 45 s.
SLOW_WHEN_TIMED = HONEST.replace("def forward(", '''@triton.jit
def _busy(s_ptr):
    pid = tl.program_id(0)
    tl.store(s_ptr + pid, pid.to(tl.float32))


def forward(''').replace("    return y.view(x.shape)", '''    if n == 999:
        scratch = torch.empty(200000, device=x.device)
        _busy[(200000,)](scratch)
    return y.view(x.shape)''')
# profile shapes of the embedded model as `agent tune` passes them (hottest first)
ROPE_PROFILE = ({"tokens": 780, "q_heads": 8, "kv_heads": 2, "head_dim": 32},
                {"tokens": 4, "q_heads": 8, "kv_heads": 2, "head_dim": 32},
                {"tokens": 1, "q_heads": 8, "kv_heads": 2, "head_dim": 32})


def test_defaults_depend_on_the_device_and_a_given_budget_wins() -> None:
    assert CheckOptions().timeout_s is None
    assert timeout_s(CheckOptions(device="cpu")) == 180.0
    assert timeout_s(CheckOptions(device="cuda")) < timeout_s(CheckOptions(device="cpu"))
    assert timeout_s(CheckOptions(device="cpu", timeout_s=33)) == 33.0
    b = Budget(start=100.0, total_s=50.0, timed=True)
    assert b.correctness_deadline == 130.0 and b.deadline == 150.0
    assert Budget(start=100.0, total_s=50.0, timed=False).correctness_deadline == 150.0


def test_timing_incomplete_is_a_correct_failure() -> None:
    assert FAILURES.index("compile-target") < FAILURES.index("timing-incomplete") < FAILURES.index("not-faster")
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="f.py", sha256="0", correct=True)
    v.fail("timing-incomplete", "correct; timing incomplete: 5/7 rounds within 180 s")
    assert v.correct and not v.accepted and v.failure == "timing-incomplete"
    row = {"verdict_id": 1, "correct": True, "accepted": False, "failure": "timing-incomplete"}
    assert outcome(row) == "correct, timing incomplete"
    assert outcome({**row, "failure": "not-faster"}) == "correct"
    assert outcome({**row, "correct": False, "failure": "timeout"}) == "wrong"


@pytest.mark.slow
def test_a_correct_candidate_cut_off_while_timed_stays_correct(tmp_path: Path) -> None:
    options = CheckOptions(device="cpu", registry_baseline=False, dtypes=("float32",), seed=3,
                           timing_shape={"tokens": 2, "hidden": 999}, timeout_s=45)
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", SLOW_WHEN_TIMED, "slow_when_timed.py")
    assert v.failure == "timing-incomplete", v.reason
    assert v.correct and not v.accepted and v.stage == "timing" and v.speedup is None
    assert re.fullmatch(r"correct; timing incomplete: [0-6]/7 rounds within 45 s", v.reason), v.reason
    assert v.timing["rounds_planned"] == 7 and v.timing["rounds"] == len(v.timing["rounds_detail"])
    assert 45 <= v.duration_s < 55


@pytest.mark.slow
def test_correctness_cannot_take_the_timings_share(tmp_path: Path) -> None:
    spin = (REPO / "tests" / "sandbox_candidates" / "infinite_loop.py").read_text()
    options = CheckOptions(device="cpu", registry_baseline=False, dtypes=("float32",), seed=3, timeout_s=20)
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", spin, "spin.py")
    assert v.failure == "timeout" and not v.correct
    assert "within 12 s (60% of the 20 s budget)" in v.reason, v.reason
    assert 12 <= v.duration_s < 17


def test_cpu_judges_caller_shapes_at_the_low_end_of_their_bucket() -> None:
    spec = get_op("rope")
    options = CheckOptions(device="cpu", dtypes=("float32",), shapes=ROPE_PROFILE, timing_shape=ROPE_PROFILE[0],
                           timing_dtype="float32")
    plan = make_plan(spec, options, seed=1)
    shapes = [t["shape"] for t in plan["trials"]]
    assert {"tokens": 129, "q_heads": 8, "kv_heads": 2, "head_dim": 32} in shapes
    ranges = [shape for shape, _ in range_cases(spec, options)]
    assert all(s["tokens"] <= max(CPU_SIZE_CAP, spec.many_rows["tokens"]) for s in shapes if s not in ranges)
    assert plan["timing"]["shape"] == {"tokens": CPU_TIMING_CAP, "q_heads": 8, "kv_heads": 2, "head_dim": 32}
    assert plan["timing"]["asked_shape"] == ROPE_PROFILE[0]
    for shape in shapes:  # same bucket as asked (what the registry entry will serve)
        asked = next((p for p in ROPE_PROFILE if interpreter_shape(spec, p) == shape), None)
        if asked is not None:
            assert spec.bucket(asked) == spec.bucket(shape)
    cuda = make_plan(spec, CheckOptions(device="cuda", dtypes=("float32",), shapes=ROPE_PROFILE,
                                        timing_shape=ROPE_PROFILE[0]), seed=1)
    assert cuda["timing"]["shape"] == ROPE_PROFILE[0] and "asked_shape" not in cuda["timing"] and ROPE_PROFILE[0] in [t["shape"] for t in cuda["trials"]]


def test_bucket_floor_keeps_zero_and_caps_the_largest_buckets() -> None:
    spec = get_op("extend_attention")
    shape = {"batch": 4, "tokens": 4096, "prefix": 0, "q_heads": 8, "kv_heads": 2, "head_dim": 32}
    assert interpreter_shape(spec, shape) == {**shape, "batch": 2, "tokens": CPU_SIZE_CAP, "prefix": 0}


@pytest.mark.parametrize("op", list(OPS))
def test_the_cpu_battery_keeps_every_case_and_dtype(op: str) -> None:
    """Coverage classes stay: every case of the op's battery, every dtype, the first two cases again."""
    spec = get_op(op)
    options = CheckOptions(device="cpu")
    plan = make_plan(spec, options, seed=1)
    trials = {(tuple(sorted(t["shape"].items())), tuple(sorted(t["variant"].items()))) for t in plan["trials"]}
    for shape, variant in check_cases(spec, options):
        assert (tuple(sorted(shape.items())), tuple(sorted(variant.items()))) in trials, (shape, variant)
    assert {t["dtype"] for t in plan["trials"]} == {dtype_name(d) for d in spec.dtypes}
    for case in (c for c in spec.battery(CPU) if not c.variant):
        if case.shape in list(spec.test_shapes) + list(spec.held_back):
            assert {t["dtype"] for t in plan["trials"] if t["shape"] == case.shape and not t["variant"]} == \
                {dtype_name(d) for d in spec.dtypes}


def test_a_shape_timed_smaller_keeps_the_registry_baseline_of_its_bucket(tmp_path: Path) -> None:
    from kernelloop.kernels.registry import Registry
    from kernelloop.kernels.registry.entry import Provenance

    spec, asked = get_op("rmsnorm"), {"tokens": 780, "hidden": 192}
    registry = Registry(tmp_path / "reg")
    entry = registry.add("rmsnorm", HONEST, device="cpu-interpreter", dtype="float32", bucket=spec.bucket(asked),
                         speedup=1.1, speedup_ci=(1.05, 1.2), provenance=Provenance("human")).entry
    options = CheckOptions(registry=registry.path, seed=4, dtypes=("float32",), rounds=2, timing_shape=asked,
                           timing_dtype="float32")
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", (REPO / "tests" / "sandbox_candidates" / "control_rmsnorm_multirow.py")
                                 .read_text(), "multirow.py")
    assert v.correct and v.baseline == f"registry {entry.id}", v.baseline
    assert v.timing["shape"] == {"tokens": CPU_TIMING_CAP, "hidden": 192} and v.timing["asked_shape"] == asked


def test_registry_baseline_false_times_against_the_ops_own_kernel(tmp_path: Path) -> None:
    # agent verify re-judges an entry against what it replaced, not against itself: registry_baseline=False.
    from kernelloop.kernels.registry import Registry
    from kernelloop.kernels.registry.entry import Provenance

    spec, asked = get_op("rmsnorm"), {"tokens": 16, "hidden": 192}
    registry = Registry(tmp_path / "reg")
    registry.add("rmsnorm", HONEST, device="cpu-interpreter", dtype="float32", bucket=spec.bucket(asked),
                 speedup=1.1, speedup_ci=(1.05, 1.2), provenance=Provenance("human"))
    options = CheckOptions(registry=registry.path, registry_baseline=False, seed=4, dtypes=("float32",), rounds=2,
                           timing_shape=asked, timing_dtype="float32")
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", HONEST, "honest.py")
    assert v.correct and v.baseline == "the op's baseline kernel", v.baseline
