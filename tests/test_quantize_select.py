"""agent quantize's choice: sensitivities, the greedy selection under the budget, the repair when KL is not additive,
the scoped registry key, the engine serving a committed selection, and the budget gate's judgement."""

from __future__ import annotations

import math

import pytest
import torch

from kernelloop.agent.gate import greedy_agreement, judge
from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.quantize.apply import Judged, scoped_entries, workload_prompts
from kernelloop.agent.quantize.measure import Quality, Sensitivity, calibrate, compare, quality, sensitivities
from kernelloop.agent.quantize.selection import greedy, ladder, select
from kernelloop.kernels.ops import baseline_source
from kernelloop.kernels.quant import SCHEMES
from kernelloop.kernels.registry import ANY_BUCKET, Entry, Provenance
from kernelloop.kernels.registry.entry import sha256_text, utc_now

VOCAB = 16
SENSITIVE = "layers.1.down_proj"


class FakeEngine:
    """A QuantizableEngine whose quantized distributions move by a planted amount per scope: each scope in a plan
    adds `cost[scheme] * weight(scope)` to one logit; `joint` scales the total when several are quantized together
    (KL not additive)."""

    weight_itemsize = 2

    def __init__(self, joint: float = 1.0, sensitive: str = SENSITIVE) -> None:
        self.shapes = {f"layers.{i}.{p}": (256, 256) for i in range(3) for p in ("qkv_proj", "down_proj")}
        self.joint, self.sensitive = joint, sensitive

    def projections(self) -> dict[str, tuple[int, int]]:
        return dict(self.shapes)

    def generate(self, prompt_ids, max_tokens, seeds):
        return [[1] * max_tokens for _ in prompt_ids]

    def planned_logprobs(self, pairs, plan):
        shift = sum((4.0 if scope == self.sensitive else 0.05) * (1.0 if name == "int8" else 3.0)
                    for scope, name in plan.items())
        if len(plan) > 1:
            shift *= self.joint
        out = []
        for _, continuation in pairs:
            logits = torch.zeros(len(continuation), VOCAB)
            logits[:, 3] += shift
            out.append(torch.log_softmax(logits, -1))
        return out


def fake_calibration(engine: FakeEngine):
    return calibrate(engine, [[5, 6], [7]], 3)


def test_a_planted_sensitive_projection_is_never_chosen_and_one_scheme_per_scope_within_budget():
    engine = FakeEngine()
    cal = fake_calibration(engine)
    sens = sensitivities(engine, cal, [SCHEMES["int8"], SCHEMES["int4"]])
    assert len(sens) == 2 * len(engine.shapes)
    solo = {(s.scope, s.scheme): s.kl for s in sens}
    assert solo[(SENSITIVE, "int8")] > 100 * solo[("layers.0.down_proj", "int8")]
    budget = 0.05
    selection = select(sens, budget, lambda plan: quality(engine, cal, plan))
    scopes = [s.scope for s in selection.chosen]
    assert SENSITIVE not in scopes
    assert len(scopes) == len(set(scopes))  # at most one scheme per scope
    assert sum(s.kl for s in selection.chosen) <= budget
    assert selection.within_budget and selection.chosen
    # the control: with nothing planted, the same scope is chosen like any other
    calm = FakeEngine(sensitive="none")
    calm_cal = fake_calibration(calm)
    calm_sel = select(sensitivities(calm, calm_cal, [SCHEMES["int8"]]), budget, lambda p: quality(calm, calm_cal, p))
    assert SENSITIVE in calm_sel.plan


def sens_row(scope: str, scheme: str, kl: float, saved: int = 1000) -> Sensitivity:
    return Sensitivity(scope, scheme, kl, 1.0, 2 * saved, saved)


def test_greedy_takes_the_most_bytes_per_nat_and_stops_at_the_budget():
    rows = [sens_row("a", "int8", 0.01, 500), sens_row("a", "int4", 0.02, 800),
            sens_row("b", "int8", 0.03, 500), sens_row("c", "int8", 0.001, 100)]
    chosen = greedy(rows, 0.035)
    # rungs: c (1e5 bytes/nat), a to int8 (5e4), a from int8 to int4 (300 more bytes for 0.01 more: 3e4), b (1.7e4)
    # would pass the budget; a ends at int4, one scheme per scope
    assert [(s.scope, s.scheme) for s in chosen] == [("c", "int8"), ("a", "int4")]
    assert sum(s.kl for s in chosen) <= 0.035
    assert [(s.scope, s.scheme) for s in greedy(rows, 0.02)] == [("c", "int8"), ("a", "int8")]  # no room for a's int4


def knee_rows(int4_extra_bytes: int) -> list[Sensitivity]:
    """Four projections whose int8 saves 1000 bytes for 0.001 nats (1e6 bytes per nat, together too) and whose
    int4 adds `int4_extra_bytes` for 0.01 nats more."""
    return [sens_row(f"p{i}", "int8", 0.001, 1000) for i in range(4)] + \
           [sens_row(f"p{i}", "int4", 0.011, 1000 + int4_extra_bytes) for i in range(4)]


def test_the_climb_stops_at_the_knee_and_reports_what_filling_the_budget_would_add():
    steep = knee_rows(200)  # int4 rungs: 2e4 bytes per nat, 50x dearer than the int8 selection so far
    assert {s.scheme for s in greedy(steep, 0.05)} == {"int8"}
    assert {s.scheme for s in greedy(steep, 0.05, knee=0)} == {"int4"}  # 0.004 + 4 x 0.01 fits: fill the budget
    assert {s.scheme for s in greedy(steep, 0.05, knee=60)} == {"int4"}  # a looser knee lets them through
    mild = knee_rows(500)  # 5e4 bytes per nat: 20x dearer, under the default 30x
    assert {s.scheme for s in greedy(mild, 0.05)} == {"int4"}
    selection = select(steep, 0.05, lambda plan: Quality(0.001 * len(plan), 1.0, 10))
    assert selection.plan == {f"p{i}": "int8" for i in range(4)}
    assert selection.knee == {"factor": 30.0, "stopped_before": "p0:int4", "left_rungs": 4, "left_bytes": 800,
                              "left_kl": pytest.approx(0.04)}
    assert select(steep, 0.05, lambda plan: Quality(0.01, 1.0, 10), knee=0).knee == {"factor": 0.0}


def test_free_rungs_do_not_set_the_knee():
    free = [sens_row(f"z{i}", "int8", 0.0, 1000) for i in range(3)]  # rounding-level KL: a rate of 1e12 bytes per nat
    paid = [sens_row("p", "int8", 0.001, 1000)]
    assert [s.scope for s in greedy(free + paid, 0.05)] == ["z0", "z1", "z2", "p"]


def test_a_ladder_keeps_only_the_schemes_worth_a_step():
    options = [sens_row("a", "int8", 0.01, 500), sens_row("a", "fp8", 0.02, 450), sens_row("a", "int4", 0.011, 800)]
    rungs = ladder(options)
    # fp8 saves less than int8 for more KL: never a rung; int4 costs little more than int8 and is one step from full
    assert [(r.to.scheme, r.extra_bytes) for r in rungs] == [("int4", 800)]
    steep = [sens_row("b", "int8", 0.01, 500), sens_row("b", "int4", 0.5, 800)]
    assert [(r.to.scheme, r.extra_bytes, r.height) for r in ladder(steep)] == [("int8", 500, 0), ("int4", 300, 1)]
    assert ladder(steep)[1].extra_kl == pytest.approx(0.49)
    # a projection stopped by the budget climbs no further, even when its next rung is tiny
    rows = steep + [sens_row("c", "int8", 0.02, 400), sens_row("c", "int4", 0.0201, 401)]
    assert greedy(rows, 0.025) == [rows[0]]


def test_the_repair_steps_int4_down_to_int8_before_dropping_a_projection():
    rows = [sens_row(f"s{i}", "int8", 0.001, 500) for i in range(3)] + \
           [sens_row(f"s{i}", "int4", 0.004, 800) for i in range(3)]
    measured = []

    def measure(plan):  # KL not additive: int4 costs twice its solo KL together
        measured.append(dict(plan))
        return Quality(sum(0.001 if v == "int8" else 0.008 for v in plan.values()), 1.0, 10)

    selection = select(rows, 0.015, measure)
    assert measured[0] == {"s0": "int4", "s1": "int4", "s2": "int4"}  # greedy: 3 x 0.004 within 0.015
    assert selection.within_budget and len(selection.plan) == 3  # every projection kept, some back at int8
    assert "int8" in selection.plan.values() and selection.repairs


def test_a_selection_within_budget_at_its_mean_but_not_its_upper_bound_is_repaired():
    rows = [sens_row(f"s{i}", "int8", 0.001, 500) for i in range(4)]

    def measure(plan):
        return Quality(0.001 * len(plan), 1.0, 10, kl_se=0.0005 * len(plan))

    selection = select(rows, 0.0042, measure)
    assert selection.measured.kl_upper <= 0.0042 and selection.repairs
    assert len(selection.plan) == 2  # 4 fit at the mean (0.004), not at the bound (0.0073); 3 neither (0.0055)


def test_the_standard_error_counts_prompts_as_clusters():
    ref = [torch.log_softmax(torch.zeros(4, VOCAB), -1)] * 2
    same = compare(ref, ref)
    assert same.kl == 0 and same.kl_se == 0 and same.kl_upper == 0
    shifted = torch.zeros(4, VOCAB)
    shifted[:, 3] = 2.0
    low, high = torch.log_softmax(shifted, -1), torch.log_softmax(2 * shifted, -1)
    steady = compare(ref, [low, low])  # every prompt alike: no spread between prompts
    varied = compare(ref, [low, high])  # one prompt far worse: the mean is uncertain
    assert steady.kl_se == pytest.approx(0, abs=1e-12) and varied.kl_se > 0.2 * varied.kl
    one = compare(ref[:1], [torch.cat([low[:2], high[:2]])])  # one prompt: its positions are the clusters
    assert one.kl_se > 0 and one.kl_upper > one.kl


def test_the_repair_drops_choices_until_the_measured_kl_is_within_budget_when_kl_is_not_additive():
    engine = FakeEngine(joint=3.0, sensitive="none")  # the joint KL is far over the sum of solo KLs
    cal = fake_calibration(engine)
    sens = sensitivities(engine, cal, [SCHEMES["int8"]])
    budget = 0.01
    greedy_plan = {s.scope: s.scheme for s in greedy(sens, budget)}
    assert quality(engine, cal, greedy_plan).kl > budget  # greedy alone would break the budget
    selection = select(sens, budget, lambda plan: quality(engine, cal, plan))
    assert selection.repairs and selection.within_budget
    assert selection.measured.kl == pytest.approx(quality(engine, cal, selection.plan).kl)
    assert 0 < len(selection.plan) < len(greedy_plan)


def test_a_weight_with_planted_outliers_is_the_most_sensitive_projection_of_the_embedded_model():
    engine = LocalEngine(device="cpu", kernels="reference")
    layer = engine.engine.model.layers[0]
    with torch.no_grad():
        layer.down_proj[:, :4] *= 300  # per-channel int8 scales now flush the rest of each row to zero
    prompts = workload_prompts(engine, 2, seed=0)
    cal = calibrate(engine, prompts, 3)
    sens = sensitivities(engine, cal, [SCHEMES["int8"]])
    worst = max(sens, key=lambda s: s.kl)
    assert worst.scope == "layers.0.down_proj"
    budget = sorted(s.kl for s in sens)[-2] * 2  # room for every other projection, not for the planted one
    selection = select(sens, budget, lambda plan: quality(engine, cal, plan))
    assert "layers.0.down_proj" not in selection.plan and selection.plan


def test_workload_prompts_are_disjoint_between_seeds():
    engine = LocalEngine(device="cpu", kernels="reference")
    cal = workload_prompts(engine, 4, seed=0)
    held = workload_prompts(engine, 4, seed=1, avoid=cal)
    assert len(cal) == len(held) == 4
    assert not {tuple(p) for p in cal} & {tuple(p) for p in held}


# -- the scoped registry key ---------------------------------------------------------------------------------------

class _Verdict:
    correct, batch_invariant, reason = True, None, "correct"


def judged(*names: str) -> dict[str, Judged]:
    return {n: Judged(SCHEMES[n], baseline_source(SCHEMES[n].op), _Verdict()) for n in names}


def unscoped_linear() -> tuple[Entry, str]:
    source = baseline_source("linear")
    return Entry(op="linear", device="cpu-interpreter", dtype="float32", bucket=ANY_BUCKET, sha256=sha256_text(source),
                 speedup=1.2, speedup_ci=(1.1, 1.3), provenance=Provenance("search"), verified_at=utc_now()), source


def test_scoped_entries_of_one_op_are_kept_per_scope_and_replace_scoped_drops_the_previous_selection(registry):
    linear, source = unscoped_linear()
    registry.add("linear", source, device=linear.device, dtype="float32", bucket=ANY_BUCKET, speedup=1.2,
                 speedup_ci=(1.1, 1.3), provenance=linear.provenance)
    plan = {"layers.0.down_proj": "int8", "layers.1.down_proj": "int8"}
    first = registry.replace_scoped("cpu-interpreter", "float32",
                                    scoped_entries(plan, judged("int8"), "cpu-interpreter", "float32"), "q1")
    entries = registry.entries()
    assert sorted(e.scope for e in entries if e.op == "linear_int8") == sorted(plan)  # same op, both kept
    assert [e.op for e in entries if not e.scope] == ["linear"]
    assert all(e.bucket == ANY_BUCKET and e.speedup == 1.0 and e.provenance.proposer == "quantize"
               for e in entries if e.scope)
    second = registry.replace_scoped("cpu-interpreter", "float32", scoped_entries(
        {"lm_head": "int4"}, judged("int4"), "cpu-interpreter", "float32"), "q2")
    after = registry.entries()
    assert {(e.op, e.scope) for e in after if e.scope} == {("linear_int4", "lm_head")}  # the previous selection dropped
    assert [e.id for e in after if not e.scope] == [e.id for e in entries if not e.scope]  # unscoped linear untouched
    registry.rollback(second)
    assert {(e.op, e.scope) for e in registry.entries()} == {(e.op, e.scope) for e in entries}
    assert first != second


def test_the_engine_serves_the_committed_selection_as_the_in_process_plan_does(registry):
    plan = {"layers.0.down_proj": "int8"}
    registry.replace_scoped("cpu-interpreter", "float32",
                            scoped_entries(plan, judged("int8"), "cpu-interpreter", "float32"), "quantize")
    served = LocalEngine(device="cpu", kernels="registry", registry=str(registry.path), dtype="float32")
    plain = LocalEngine(device="cpu", kernels="registry", registry=str(registry.path) + "-empty", dtype="float32")
    pairs = [([1, 2, 3, 4], [5, 6])]
    got = served.planned_logprobs(pairs, {})[0]
    assert any(name == "linear_int8@layers.0.down_proj" and all(v.startswith("registry:") for v in variants.values())
               for name, variants in served.engine.kernels.variants_in_use().items())
    unquantized = plain.planned_logprobs(pairs, {})[0]
    in_process = plain.planned_logprobs(pairs, plan)[0]
    assert not torch.equal(got, unquantized)
    torch.testing.assert_close(got, in_process, atol=1e-6, rtol=1e-6)


# -- the budget gate ---------------------------------------------------------------------------------------------

SPEED = {"before": [10.0], "after": [5.0], "ratios": [0.5], "ratio": 0.5, "interval": [0.5, 0.5]}


def summaries(kl_after: float) -> tuple[dict, dict]:
    before = {"greedy": [[1, 2, 3], [4, 5]], "kl": 1e-6}
    after = {"greedy": [[1, 9, 3], [4, 5]], "kl": kl_after}
    return before, after


def test_the_budget_gate_passes_within_budget_with_changed_greedy_tokens():
    before, after = summaries(0.01)
    config = GateConfig(kl_budget=0.05)
    result = judge(before, after, SPEED, config, interpreted=True)
    assert result.ok and not result.greedy_same
    assert result.agreement == pytest.approx(4 / 5) and result.kl_budget == 0.05
    assert "cpu-interpreter" in result.reason
    # the identity gate (no budget) fails the same change; and a confident slowdown fails on CUDA timings
    assert not judge(before, after, SPEED, GateConfig()).ok
    assert not judge(before, after, SPEED, config, interpreted=False).ok


def test_the_budget_gate_reports_teacher_forced_agreement_beside_free_running():
    before, after = summaries(0.01)
    after.update(forced_agreement=0.98, kl_positions=120)
    result = judge(before, after, SPEED, GateConfig(kl_budget=0.05), interpreted=True)
    assert result.ok and result.forced_agreement == 0.98
    assert ("greedy agreement 98% teacher-forced over 120 positions (greedy agreement 80% free-running over 5 "
            "tokens)") in result.reason


def test_the_budget_gate_fails_over_budget():
    before, after = summaries(0.2)
    result = judge(before, after, SPEED, GateConfig(kl_budget=0.05), interpreted=True)
    assert not result.ok and "over the budget" in result.reason


def test_greedy_agreement_counts_positions_one_side_lacks_as_disagreement():
    assert greedy_agreement([[1, 2, 3]], [[1, 2]]) == pytest.approx(2 / 3)
    assert greedy_agreement([], []) == 1.0
    assert math.isclose(greedy_agreement([[1], [2, 3]], [[1], [2, 3]]), 1.0)


def test_quality_of_the_empty_plan_is_zero_kl():
    engine = FakeEngine()
    cal = fake_calibration(engine)
    assert quality(engine, cal, {}) == Quality(0.0, 1.0, cal.positions)
