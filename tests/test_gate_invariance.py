"""Batch invariance in the gate on a real engine (engine/gate_invariance.py, agent/invariance.py): a planted
kernel fault that changes results only inside large batches fails the gate with the first diverging
token; the same engine without it passes, and its prefix-cache run did hit the cache.

The fault is a fused_add_rmsnorm that shifts its output when it gets 12 rows or more (as a kernel whose
reduction order changes with the batch would, only larger), put into a reference engine's dispatcher;
the gate prompts alone are prefilled in at most 9 rows and decoded in 1, so only the batch run meets it.
"""

from __future__ import annotations

import pytest

from kernelloop.agent.gate import judge, summary
from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.loop.context import LoopContext
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

from tests.hf_checkpoints import make_checkpoint

GATE = GateConfig(prompts=GATE_PROMPTS, max_tokens=3, runaway_tokens=0, invariance_tokens=12, invariance_batch=16)
SAME_SPEED = {"before": [1.0], "after": [1.0], "ratios": [1.0], "ratio": 1.0, "interval": [1.0, 1.0]}


class BatchDependent:
    """fused_add_rmsnorm, shifted by half its weight whenever it normalises 12 rows or more."""

    def __init__(self, op) -> None:  # noqa: ANN001
        self.op = op

    def __call__(self, x, residual, weight, eps):  # noqa: ANN001, ANN204
        hidden, residual = self.op(x, residual, weight, eps)
        return (hidden + 0.5 * weight if x.shape[0] >= 12 else hidden), residual


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("invariance-gate")
    model_dir = make_checkpoint(tmp / "ckpt", "gqa")
    engine = LocalEngine(model=str(model_dir), kernels="reference", dtype="float32")
    with History(tmp / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp / "reg"), proposers={}, model=str(model_dir),
                          engine=engine, gate=GATE)
        take = lambda: summary(ctx.measure_reference(), ctx.measure_engine(), invariance=ctx.batch_invariance())  # noqa: E731
        out = {"before": take(), "clean": take()}
        assert max(len(p) for p in ctx.prompt_ids()) < 12
        kd = engine.engine.kernels
        real = kd.ops["fused_add_rmsnorm"]
        kd.fused_add_rmsnorm = BatchDependent(real)
        try:
            out["faulty"] = take()
        finally:
            kd.fused_add_rmsnorm = real
        ctx.close()
    return out


def test_an_invariant_engine_passes_and_its_cache_run_hits(measured: dict) -> None:
    probe = measured["before"]["invariance"]
    assert probe["alone"] == probe["batch"] == probe["hit"]  # float32 torch ops: invariant here
    assert all(len(t) == GATE.invariance_tokens for t in probe["alone"])
    assert all(c > 0 for c in probe["cached"])  # the hit run took its prompt from the prefix cache
    result = judge(measured["before"], measured["clean"], SAME_SPEED, GATE)
    assert result.ok and "no new batch divergence in 4 prompts" in result.reason, result.reason


def test_a_planted_batch_dependent_fault_fails_the_gate_at_its_first_token(measured: dict) -> None:
    faulty = measured["faulty"]
    assert faulty["invariance"]["alone"] == measured["before"]["invariance"]["alone"]  # alone it is untouched
    no_greedy = {**faulty, "greedy": measured["before"]["greedy"], "kl": measured["before"]["kl"]}
    result = judge(measured["before"], no_greedy, SAME_SPEED, GATE)
    assert not result.ok and result.reason.startswith("batch invariance: prompt "), result.reason
    assert " decodes differently in a batch from token " in result.reason
    new = [r for r in result.invariance if r["new"]]
    assert new and all(r["after"].startswith("in a batch") for r in new)
