"""Confirmation rounds: a first look whose median clears the bar but whose interval does not (one noisy
round on a busy machine) earns as many rounds again, judged together at the error the first look left."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

from kernelloop.common.stats import ALPHA, median_interval, order_rank
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.roofline import Rates
from kernelloop.sandbox import CheckOptions, Sandbox
from kernelloop.sandbox.judge import decisions
from kernelloop.sandbox.judge.budget import Budget
from kernelloop.sandbox.judge.candidate_run import CandidateRun
from kernelloop.sandbox.judge.plan import make_plan
from kernelloop.sandbox.judge.timing import ABTimer
from kernelloop.sandbox.verdict import Verdict

REPO = Path(__file__).resolve().parents[1]
HONEST = (REPO / "tests" / "sandbox_candidates" / "control_rmsnorm_row.py").read_text()
SPEC = get_op("rmsnorm")
SHAPE = {"tokens": 2, "hidden": 64}


def _rounds(ratios: list[float]) -> list[dict[str, list[float]]]:
    return [{"baseline": [1e-3 * r] * 3, "candidate": [1e-3] * 3} for r in ratios]


def _judged(ratios: list[float], first_look: int = 0) -> Verdict:
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0", correct=True)
    decisions.judge_timing(v, SPEC, SHAPE, torch.float32, _rounds(ratios), 0.03, Rates(1e12, 1e15), "test", first_look)
    return v


ONE_NOISY = [1.7, 1.6, 1.02, 1.8, 1.65, 1.7, 1.75]  # the CI run that refused a 1.675x winner


def test_one_noisy_round_is_worth_confirming_and_a_clear_answer_is_not() -> None:
    assert _judged(ONE_NOISY).failure == "not-faster"
    assert decisions.worth_confirming(_rounds(ONE_NOISY), 0.03)
    assert not decisions.worth_confirming(_rounds([1.7] * 7), 0.03)  # accepted as it is
    assert not decisions.worth_confirming(_rounds([1.0, 0.98, 1.01, 1.02, 0.99, 1.0, 1.03]), 0.03)  # median below
    assert not decisions.worth_confirming(_rounds([1.5, 1.6, 0.9, 1.0, 1.02, 0.95, 1.01]), 0.03)


def test_all_rounds_are_judged_at_the_error_the_first_look_left() -> None:
    v = _judged(ONE_NOISY + [1.7, 1.6, 1.66, 1.72, 1.02, 1.69, 1.71], first_look=7)
    assert v.accepted and v.timing["rounds"] == 14 and v.timing["first_look_rounds"] == 7
    # 14 rounds after a 7-round look: [x(3), x(12)]; both noisy rounds are outside it
    assert v.speedup_interval == [1.6, 1.72]
    worse = _judged(ONE_NOISY + [1.7, 1.02, 1.66, 1.01, 1.02, 1.69, 1.71], first_look=7)
    assert worse.failure == "not-faster", worse.reason  # three noisy rounds of 14 still refuse it


@pytest.mark.parametrize("rounds", [7, 15])
def test_both_looks_together_claim_an_a_a_faster_at_most_as_often_as_one_look_may(rounds: int) -> None:
    """Same kernel both sides: a claim is a false one. Looking twice must not spend more than 2.5%."""
    rng = random.Random(rounds)
    runs, false = 20000, 0
    for _ in range(runs):
        first = [rng.lognormvariate(0, 0.05) for _ in range(rounds)]
        median, lo, _ = median_interval(first)
        if lo > 1.0:
            false += 1
        elif median > 1.0:  # worth confirming at min_gain 0
            both = first + [rng.lognormvariate(0, 0.05) for _ in range(rounds)]
            false += median_interval(both, ALPHA - order_rank(rounds)[1])[1] > 1.0
    assert false / runs <= ALPHA, false / runs


def test_the_plan_holds_fresh_seeds_for_confirmation_unless_turned_off() -> None:
    timing = make_plan(SPEC, CheckOptions(), 3)["timing"]
    planned = {s for r in timing["rounds"] for s in r}
    assert len(timing["confirm"]) == len(timing["rounds"]) == 7
    assert not planned & {s for r in timing["confirm"] for s in r}  # new inputs: nothing to have memoized
    assert "confirm" not in make_plan(SPEC, CheckOptions(confirm=False), 3)["timing"]


class _ScriptedSandbox:
    """What ABTimer uses of a Sandbox, with calls that take scripted seconds (no sandboxed process)."""

    def __init__(self, seconds, options: CheckOptions, budget_s: float = 60.0) -> None:  # noqa: ANN001
        self.options, self.registry, self.fingerprint = options, None, "cpu-interpreter"
        now = time.monotonic()
        self.run = CandidateRun(budget=Budget(now, budget_s, True), memory_mb=0, deadline=now + budget_s)
        self.seconds, self.phases = seconds, []

    def progress(self, step) -> None:  # noqa: ANN001
        pass

    def checked_call(self, v, spec, runner, replayer, where, args, expected, shape):  # noqa: ANN001
        self.phases.append(where.split(" (")[0])
        seconds = self.seconds(where.split(" (")[0], runner)
        if seconds is None:
            v.fail("mismatch", f"{where}: scripted")
        return seconds


SEVEN = CheckOptions(rounds=7)


def _time(seconds, options: CheckOptions = SEVEN,  # noqa: ANN001
          budget_s: float = 60.0) -> tuple[Verdict, _ScriptedSandbox]:
    sandbox = _ScriptedSandbox(seconds, options, budget_s)
    timer = ABTimer(sandbox)
    timer.baseline_children = lambda spec, timing, v, work: ("base", "base-replayer", "baseline")
    timing = make_plan(SPEC, options, 5)["timing"]
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0", correct=True)
    timer.time_candidate(SPEC, timing, v, Path("."), "cand", "cand-replayer")
    return v, sandbox


def _noisy_round_3(where: str, runner: str) -> float:
    if runner == "base":
        return 1.7e-3 if where != "timing round 3" else 1.0e-3  # the machine was busy during round 3
    return 1e-3


def test_a_noisy_first_look_is_confirmed_and_accepted() -> None:
    v, sandbox = _time(_noisy_round_3)
    assert v.accepted, v.reason
    assert v.timing["rounds"] == 14 and v.timing["first_look_rounds"] == 7
    assert "confirmation round 7" in sandbox.phases and "confirmation round 8" not in sandbox.phases
    assert not [c for c in v.checks if "round" in c.name]  # per-call checks of timing are not kept


def test_no_confirmation_without_the_budget_for_it_or_when_turned_off() -> None:
    def slow(where: str, runner: str) -> float:
        time.sleep(0.005)
        return _noisy_round_3(where, runner)

    v, sandbox = _time(slow, budget_s=0.4)  # 8 rounds of 6 calls take >= 0.24 s: 7 more would not fit
    assert v.failure == "not-faster" and v.timing["rounds"] == 7 and "first_look_rounds" not in v.timing
    assert not [p for p in sandbox.phases if p.startswith("confirmation")]
    v, _ = _time(_noisy_round_3, CheckOptions(rounds=7, confirm=False))
    assert v.failure == "not-faster" and v.timing["rounds"] == 7


def test_a_call_failing_in_a_confirmation_round_fails_the_candidate() -> None:
    def fails_late(where: str, runner: str) -> float | None:
        return None if where == "confirmation round 2" and runner == "cand" else _noisy_round_3(where, runner)

    v, _ = _time(fails_late)
    assert v.failure == "mismatch" and "confirmation round 2" in v.reason and not v.accepted


def test_a_real_candidate_runs_its_confirmation_rounds_in_the_sandbox(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "worth_confirming", lambda rounds, min_gain: True)
    options = CheckOptions(registry=tmp_path / "no-registry", seed=4, dtypes=("float32",), rounds=2,
                           batch_invariance=False)
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", HONEST, "honest.py")
    assert v.correct and v.timing["rounds"] == 4 and v.timing["first_look_rounds"] == 2, v.reason
    assert len(v.timing["rounds_detail"]) == 4
