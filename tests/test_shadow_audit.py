"""Scoring served requests against the reference and judging a commit's window (agent/shadow_audit.py)."""

from __future__ import annotations

import math

import torch

from kernelloop.agent.shadow_audit import AuditConfig, breach, coarse_kl, figures, json_valid, score_sample
from kernelloop.engine.teacher_force import TeacherForced

VOCAB = 6


def reference(rows: list[list[float]]) -> TeacherForced:
    return TeacherForced(torch.log_softmax(torch.tensor(rows, dtype=torch.float32), dim=-1))


def served_top(ref: TeacherForced, i: int, k: int = 3, tilt: float = 0.0) -> list[list[float]]:
    """The served top-k at position i: the reference's own (tilt 0) or a sharpened one."""
    lp = torch.log_softmax(ref.logprobs[i] * (1 + tilt), dim=-1)
    top = lp.topk(k)
    return [[int(t), float(v)] for t, v in zip(top.indices, top.values)]


REF = reference([[3, 1, 0, 0, 0, 0], [0, 0, 4, 1, 0, 0], [0, 2, 0, 0, 0, 5]])


def test_coarse_kl_is_zero_for_the_reference_itself_and_grows_with_a_tilt() -> None:
    assert coarse_kl(served_top(REF, 0), REF.logprobs[0]) < 1e-6
    assert coarse_kl(served_top(REF, 0, tilt=2.0), REF.logprobs[0]) > 0.05
    # one bucket for the rest: the served top-1 alone holding all its mass is judged against the reference's
    assert math.isclose(coarse_kl([[0, 0.0]], REF.logprobs[0]), -float(REF.logprobs[0][0]), rel_tol=1e-5)


def test_a_faithful_greedy_sample_scores_clean() -> None:
    sample = {"served_ids": [0, 2, 5], "greedy": True,
              "served_logprobs": [{"top": served_top(REF, i)} for i in range(3)], "json_asked": False}
    score = score_sample(sample, REF)
    assert score.agreement == 1.0 and score.kl < 1e-6 and not score.loop and score.json_valid is None


def test_a_diverging_sample_loses_agreement_and_a_sampled_one_is_not_held_to_the_argmax() -> None:
    sample = {"served_ids": [1, 2, 1], "greedy": True, "served_logprobs": None}
    assert math.isclose(score_sample(sample, REF).agreement, 1 / 3)
    assert score_sample({**sample, "greedy": False}, REF).agreement is None
    assert score_sample(sample, REF).kl is None  # no served logprobs: no KL


def test_loops_and_json_validity() -> None:
    looping = [4] * 20
    ref = reference([[0, 0, 0, 0, 5, 0]] * 20)
    assert score_sample({"served_ids": looping, "greedy": True}, ref).loop
    assert json_valid(' {"a": [1, 2]} ') and json_valid('```json\n[1]\n```')
    assert not json_valid('{"a": 1') and not json_valid('"a string"') and not json_valid("")
    asked = score_sample({"served_ids": [0], "greedy": True, "json_asked": True}, reference([[1, 0, 0, 0, 0, 0]]), '{"x"')
    assert asked.json_asked and asked.json_valid is False


def rows(n: int, **fields) -> list[dict]:
    return [{"agreement": 1.0, "kl": 0.001, "loop": False, "json_asked": False, "json_valid": None, **fields}
            for _ in range(n)]


def test_breach_thresholds_and_a_clean_control() -> None:
    config = AuditConfig(window=20, min_samples=5)
    assert breach(figures(rows(20)), config) is None  # the clean control
    assert "agreement" in breach(figures(rows(10, agreement=0.5)), config)
    assert "KL" in breach(figures(rows(10, kl=0.2)), config)
    assert "loop" in breach(figures(rows(10, loop=True)), config)
    assert "JSON" in breach(figures(rows(10, json_asked=True, json_valid=False)), config)
    assert breach(figures(rows(4, agreement=0.0)), config) is None  # too few samples to judge
    skipped = figures(rows(3) + [{"loop": None}])  # a sample the reference could not score counts for nothing
    assert skipped["samples"] == 3
