"""The gate's task audit on the real model (`--model smollm2`; agent/task_audit.py, agent/gate.py): a planted
kernel fault that only the task audit catches, and the same engine without it passes.

The fault is a decode attention that forgets the KV cache past position 256, put into the engine's
dispatcher directly (as tests/test_gate_runaway.py plants its fault): the gate's short prompts decode
exactly as before (greedy tokens and KL unchanged), but the later steps of the suite's 15-step agent
trace, whose conversations run past 256 tokens, lose their context. The suite here is steps 2-7 of
agent-v1's trace (short answers), to keep the test within its budget (the whole suite takes minutes
per audit on 2 CPU cores); the engine runs the float32 torch ops.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelloop.agent.gate import judge, summary
from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.task_suite import BUNDLED
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.model_source import resolve_model_dir
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

FORGET_PAST = 256
STEPS = range(2, 8)  # trace steps 2-3 stay under FORGET_PAST with their answers, 4-7 go past it
# Three audits of the suite (before, clean, faulty) on 2 CPU cores: ~2 minutes alone, more on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SAME_SPEED = {"before": [1.0], "after": [1.0], "ratios": [1.0], "ratio": 1.0, "interval": [1.0, 1.0]}


class Forgetful:
    """decode_attention over at most the first FORGET_PAST cached tokens of each request."""

    def __init__(self, op) -> None:  # noqa: ANN001
        self.op = op

    def __call__(self, q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):  # noqa: ANN001, ANN204
        starts, lens = kv_indptr[:-1].long(), (kv_indptr[1:] - kv_indptr[:-1]).long().clamp(max=FORGET_PAST)
        indices = torch.cat([kv_indices[s:s + n] for s, n in zip(starts.tolist(), lens.tolist())])
        indptr = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(kv_indptr.dtype)
        return self.op(q, k_buffer, v_buffer, indptr, indices, sm_scale)


@pytest.fixture(scope="module")
def trace_suite(tmp_path_factory) -> Path:
    """Steps 2-7 of agent-v1's trace as a suite of their own, answers cut at 24 tokens (a call takes ~20)."""
    lines = (BUNDLED / "agent-v1.jsonl").read_text().splitlines()
    header = {**json.loads(lines[0]), "suite": "agent-v1-trace", "max_tokens": 24}
    items = [line for line in lines[1:] if json.loads(line).get("step") in STEPS]
    assert len(items) == len(STEPS)
    path = tmp_path_factory.mktemp("tasks") / "trace.jsonl"
    path.write_text("\n".join([json.dumps(header), *items]) + "\n")
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory, trace_suite: Path) -> dict:
    try:
        model = str(resolve_model_dir("smollm2"))
    except ModelLoadError as exc:
        pytest.skip(f"smollm2 is unavailable: {exc}")
    gate = GateConfig(prompts=GATE_PROMPTS[:2], max_tokens=3, runaway_tokens=0, invariance_tokens=0,
                      tasks=str(trace_suite))
    tmp = tmp_path_factory.mktemp("tasks-gate")
    engine = LocalEngine(model=model, kernels="reference", dtype="float32")
    with History(tmp / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp / "reg"), proposers={}, model=model,
                          engine=engine, gate=gate)
        take = lambda: summary(ctx.measure_reference(), ctx.measure_engine(), tasks=ctx.task_audit())  # noqa: E731
        out = {"gate": gate, "lengths": [len(p) for p in ctx.task_suite()[1]],
               "gate_lengths": [len(p) + gate.max_tokens for p in ctx.prompt_ids()], "before": take(), "clean": take()}
        kd = engine.engine.kernels
        real = kd.ops["decode_attention"]
        kd.decode_attention = Forgetful(real)
        try:
            out["faulty"] = take()
        finally:
            kd.decode_attention = real
        ctx.close()
    return out


def test_the_clean_engine_passes_and_the_model_follows_the_trace(measured: dict) -> None:
    before = measured["before"]["tasks"]
    assert before["suite"] == "agent-v1-trace v1" and before["skipped"] == 0
    assert sum(before["passed"]) >= 5, before["wrong"]  # smollm2 follows the trace
    assert max(measured["lengths"]) > FORGET_PAST > max(measured["gate_lengths"])  # the fault's premise
    result = judge(measured["before"], measured["clean"], SAME_SPEED, measured["gate"])
    assert result.ok, result.reason
    assert result.tasks is not None and not result.tasks["failed"] and "tasks agent-v1-trace v1 accuracy" in result.reason


def test_a_fault_past_256_tokens_fails_only_the_task_audit(measured: dict) -> None:
    before, faulty, gate = measured["before"], measured["faulty"], measured["gate"]
    long_steps = [i for i, n in enumerate(measured["lengths"]) if n > FORGET_PAST]
    assert len(long_steps) == 4 and all(before["tasks"]["passed"][i] for i in long_steps)
    result = judge(before, faulty, SAME_SPEED, gate)
    assert not result.ok and result.reason.startswith("tasks: agent-v1-trace v1 accuracy"), result.reason
    assert result.greedy_same and result.kl_after == result.kl_before  # the gate's short prompts see nothing
    assert result.tasks["failed"] and result.tasks["interval"][1] < 1 - gate.task_tolerance
    assert any(faulty["tasks"]["passed"][i] is False for i in long_steps)
    no_tasks = {k: v for k, v in faulty.items() if k != "tasks"}
    assert judge(before, no_tasks, SAME_SPEED, gate).ok  # without the audit the fault passes the gate
