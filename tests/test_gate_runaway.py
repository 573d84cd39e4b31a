"""The gate's runaway check on a real engine (agent/runaway.py, agent/gate.py): a planted kernel fault
that makes the model loop is caught by the long generations, and the same engine without it passes.

The fault is a fused_add_rmsnorm whose output collapses onto one direction, put into the engine's
dispatcher directly: what a kernel that misbehaves only in production looks like to the gate (the
per-op judge never sees it). The engine runs the float32 torch ops, so 96-token generations take a
second; the model's embeddings are small, so its own sampled text does not loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.agent.gate import judge, summary
from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.runaway import MIN_REPEATS
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

from tests.hf_checkpoints import make_checkpoint

GATE = GateConfig(prompts=GATE_PROMPTS[:3], max_tokens=3, runaway_tokens=96, runaway_sampling=(1234, 77))
SAME_SPEED = {"before": [1.0], "after": [1.0], "ratios": [1.0], "ratio": 1.0, "interval": [1.0, 1.0]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("runaway") / "ckpt", "gqa", embed_std=0.05)


class Collapsing:
    """fused_add_rmsnorm with every output row replaced by 100 x its weight (the residual kept)."""

    def __init__(self, op) -> None:  # noqa: ANN001
        self.op = op

    def __call__(self, x, residual, weight, eps):  # noqa: ANN001, ANN204
        hidden, residual = self.op(x, residual, weight, eps)
        return hidden * 0.0 + weight * 100.0, residual


@pytest.fixture(scope="module")
def measured(tmp_path_factory, model_dir: Path) -> dict:
    tmp = tmp_path_factory.mktemp("runaway-gate")
    engine = LocalEngine(model=str(model_dir), kernels="reference", dtype="float32")
    with History(tmp / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp / "reg"), proposers={}, model=str(model_dir),
                          engine=engine, gate=GATE)
        take = lambda: summary(ctx.measure_reference(), ctx.measure_engine(), long=ctx.long_generations())  # noqa: E731
        out = {"before": take(), "clean": take()}
        kd = engine.engine.kernels
        real = kd.ops["fused_add_rmsnorm"]
        kd.fused_add_rmsnorm = Collapsing(real)
        try:
            out["faulty"] = take()
        finally:
            kd.fused_add_rmsnorm = real
        ctx.close()
    return out


def test_the_model_itself_does_not_loop_and_every_generation_is_long(measured: dict) -> None:
    long = measured["before"]["long"]
    assert long["sampling"] == [f"prompt {i}, seed {s}" for i in range(3) for s in (1234, 77)]
    lengths = [len(ids) for ids in long["outputs"]]  # EOS ends a generation (1 in 211 at each position)
    assert max(lengths) == GATE.runaway_tokens and sum(lengths) >= 3 * GATE.runaway_tokens, lengths
    result = judge(measured["before"], measured["clean"], SAME_SPEED, GATE)
    assert result.ok, result.reason
    assert "no new loop in 6 long generations" in result.reason
    assert max(r["before"]["repeats"] for r in result.runaway) < MIN_REPEATS


def test_a_planted_looping_fault_fails_the_gate_with_each_loop_named(measured: dict) -> None:
    result = judge(measured["before"], measured["faulty"], SAME_SPEED, GATE)
    assert not result.ok
    flagged = [r for r in result.runaway if r["runaway"]]
    assert len(flagged) == 6 and all(r["after"]["repeats"] >= MIN_REPEATS for r in flagged)
    # greedy outputs change too (judged first); the record names the loops either way
    assert result.reason.startswith("greedy output of prompt") or result.reason.startswith("runaway: prompt 0")
    no_greedy = {**measured["faulty"], "greedy": measured["before"]["greedy"], "kl": measured["before"]["kl"]}
    alone = judge(measured["before"], no_greedy, SAME_SPEED, GATE)
    assert alone.reason.startswith("runaway: prompt 0, seed 1234: tokens [") and "; 5 more" in alone.reason
