"""A float atomic's race is judged in float32 whatever dtypes were asked (sandbox/judge/plan.py: race_dtype_case).

Rounding a float32 atomic sum to bfloat16 can give every shuffled program order the same output bits,
so a candidate naming `tl.atomic_*` judged in bfloat16 only gets one extra float32 trial, first, whose
replays in shuffled orders must match (its values are not judged: float32 was not asked for). The
planted fault is tests/sandbox_candidates/r1_float_atomic_add_sum.py; the control, whose integer atomic
hands out rows, control_rmsnorm_atomic_ticket.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox.judge.plan import make_plan
from kernelloop.sandbox.options import CheckOptions

CANDIDATES = Path(__file__).parent / "sandbox_candidates"
SEEDS = 3


def test_only_atomic_kernels_judged_without_float32_get_one_float32_race_trial_first() -> None:
    spec = get_op("rmsnorm")
    half = CheckOptions(device="cpu", dtypes=("bfloat16",))
    plan = make_plan(spec, half, 1, atomics=True)["trials"]
    assert plan[0]["dtype"] == "float32" and plan[0].get("race_only") and not plan[0]["determinism"]
    assert [t["dtype"] for t in plan[1:]] == ["bfloat16"] * (len(plan) - 1)
    assert {t["dtype"] for t in make_plan(spec, half, 1)["trials"]} == {"bfloat16"}  # no atomics: as asked
    judged = make_plan(spec, CheckOptions(device="cpu", dtypes=("float32", "bfloat16")), 1, atomics=True)["trials"]
    assert not any(t.get("race_only") for t in judged)  # float32 already judged: nothing extra


def test_a_race_only_trial_skips_the_values_and_nothing_else() -> None:
    import torch

    from kernelloop.sandbox.judge.decisions import judge_call
    from kernelloop.sandbox.verdict import Verdict

    spec, shape = get_op("rmsnorm"), {"tokens": 3, "hidden": 33}
    args = spec.make_inputs(shape, torch.float32, 7, "cpu")
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    facts = {"launches": 1, "torch_ops": [], "violations": [], "devices": ["cpu"], "count": 1}
    record = {"entries": [], "outputs": [{"buf": 2}], "inputs": 2, "problem": None}
    wrong = [spec.reference(*args) * 1.5]  # far off (a TF32 kernel meant for half dtypes, say)

    def judged(outputs: list, facts: dict, compare: bool) -> Verdict:
        v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")
        judge_call(v, spec, "here", facts, record, outputs, [t.clone() for t in inputs], inputs,
                   spec.reference(*args), CPU, shape, compare)
        return v

    assert judged(wrong, facts, True).failure == "mismatch"
    assert judged(wrong, facts, False).failure is None
    assert judged(wrong, {**facts, "launches": 0}, False).failure == "no-triton"  # every other check holds
    assert judged([wrong[0][:2]], facts, False).failure == "bad-output"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> list:
    """The race judged in bfloat16 under SEEDS plan seeds (copies of the file: the plan seed mixes in the
    source's hash), and the control, in one sandbox."""
    from kernelloop.sandbox import judge_files

    folder = tmp_path_factory.mktemp("race-dtype")
    source = (CANDIDATES / "r1_float_atomic_add_sum.py").read_text()
    copies = []
    for i in range(SEEDS):
        copies.append(folder / f"r1_copy{i}.py")
        copies[-1].write_text(f"{source}\n# copy {i}\n")
    opts = CheckOptions(device="cpu", timing=False, dtypes=("bfloat16",), seed=7, batch_invariance=False)
    return judge_files("rmsnorm", [*copies, CANDIDATES / "control_rmsnorm_atomic_ticket.py"], opts)


def test_a_float_atomic_sum_is_a_race_when_judged_in_bfloat16_only(verdicts: list) -> None:
    for v in verdicts[:SEEDS]:
        assert v.failure == "race", (v.failure, v.reason)
        assert v.reason.startswith("float32 ") and "(race check)" in v.reason, v.reason  # the float32 trial caught it


def test_an_integer_atomic_ticket_stays_correct(verdicts: list) -> None:
    v = verdicts[-1]
    assert v.correct and v.failure is None, v.reason
    assert any(c.name.endswith("(race check)") and c.ok for c in v.checks)
