"""Batch invariance in the gate: comparing a prompt's decodes alone, in a batch, from the prefix cache
(agent/invariance.py), and the gate's judgement on it (agent/gate.py)."""

from __future__ import annotations

from kernelloop.agent.gate import judge
from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.invariance import first_divergence, invariance_rows

SAME = {"alone": [[1, 2, 3], [4, 5, 6]], "batch": [[1, 2, 3], [4, 5, 6]], "hit": [[1, 2, 3], [4, 5, 6]],
        "cached": [2, 3]}
FAST = {"before": [1.0], "after": [2.0], "ratios": [2.0], "ratio": 2.0, "interval": [2.0, 2.0]}
SUMMARY = {"greedy": [[1]], "kl": 1e-6}


def test_the_first_divergence_names_the_way_the_position_and_both_tokens() -> None:
    probe = {**SAME, "batch": [[1, 2, 9], [4, 5, 6]], "hit": [[1, 7, 3], [4, 5]]}
    d = first_divergence(probe, 0)
    assert (d.way, d.position, d.alone, d.other) == ("hit", 1, 2, 7)  # the earlier of the two
    assert d.describe() == "with a prefix-cache hit from token 1 (2 alone, 7 hit)"
    short = first_divergence(probe, 1)  # a decode that ended early differs where it ended
    assert (short.way, short.position, short.alone, short.other) == ("hit", 2, 6, None)
    assert first_divergence(SAME, 0) is None


def test_only_a_divergence_the_change_introduced_is_new() -> None:
    old = {**SAME, "batch": [[1, 2, 3], [4, 8, 6]]}  # prompt 1 already diverged before the change
    new = {**SAME, "batch": [[1, 2, 9], [4, 8, 8]]}
    rows = invariance_rows(old, new)
    assert [r["new"] for r in rows] == [True, False]
    assert rows[0]["before"] is None and rows[0]["after"] == "in a batch from token 2 (3 alone, 9 batch)"
    assert rows[1]["before"] == rows[1]["after"] == "in a batch from token 1 (5 alone, 8 batch)"
    assert [r["cached"] for r in rows] == [2, 3]


def test_the_gate_fails_on_a_new_divergence_with_the_first_diverging_token() -> None:
    before = {**SUMMARY, "invariance": SAME}
    after = {**SUMMARY, "invariance": {**SAME, "batch": [[1, 2, 3], [4, 5, 7]]}}
    result = judge(before, after, FAST, GateConfig())
    assert not result.ok
    assert result.reason == "batch invariance: prompt 1 decodes differently in a batch from token 2 (6 alone, 7 batch)"
    assert [r["new"] for r in result.invariance] == [False, True]
    clean = judge(before, {**SUMMARY, "invariance": SAME}, FAST, GateConfig())
    assert clean.ok and "no new batch divergence in 2 prompts" in clean.reason
    # the model diverging before already (a kernel's own batch dependence): reported, not a failure
    already = {**SUMMARY, "invariance": after["invariance"]}
    assert judge(already, after, FAST, GateConfig()).ok
