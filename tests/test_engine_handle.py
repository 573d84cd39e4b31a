"""The tune loop reaches the engine through one handle (agent/engine_handle.py), in-process
(`LocalEngine`) or over HTTP (`RemoteEngine`), and both measure the gate the same way: the same code
(engine/gate_measure.py) and float64 log-probabilities on both paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelloop.agent.engine_handle import EngineHandle, check_handle
from kernelloop.agent.gate import Measurement, alternate_speed, mean_kl, prompt_ids, summary
from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.remote import RemoteEngine, decode_measurement
from kernelloop.common.errors import KernelloopError
from kernelloop.common.progress import Step
from kernelloop.engine.gate_measure import GateMeasurement, to_wire
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

from tests.hf_checkpoints import make_checkpoint

GATE = GateConfig(prompts=GATE_PROMPTS[:2], max_tokens=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("handle") / "ckpt", "gqa")


def test_the_wire_carries_float64_log_probabilities_bit_for_bit() -> None:
    rows = [torch.randn(3, 7, dtype=torch.float64).log_softmax(-1), torch.randn(2, 7, dtype=torch.float64)]
    sent = GateMeasurement([[1, 2, 3], [4, 5]], rows, 12.5)
    got = decode_measurement(to_wire(sent))
    assert got.greedy == sent.greedy and got.tokens_per_second == 12.5
    assert all(g.dtype == torch.float64 and torch.equal(g, r) for g, r in zip(got.logprobs, rows))
    old = {**to_wire(sent), "dtype": "float32"}  # an engine that sends float32: refused, not misread
    with pytest.raises(KernelloopError, match="float32 log-probabilities"):
        decode_measurement(old)


@pytest.mark.slow
def test_local_and_remote_handles_give_the_same_measurement(tmp_path: Path, model_dir: Path) -> None:
    from kernelloop.engine.engine import Engine, EngineConfig

    from tests.serving import serve

    config = dict(model=str(model_dir), kernels="registry", registry=str(tmp_path / "reg"))
    local = LocalEngine(**config)
    one, two = prompt_ids(local, GATE.prompts[:1]), prompt_ids(local, GATE.prompts)
    with serve(Engine(EngineConfig(**config)), "tiny") as (base, _):
        remote = RemoteEngine(base)
        for handle in (local, remote):
            assert isinstance(handle, EngineHandle) and check_handle(handle) is handle
        remote_one, remote_two = remote.measure(one, GATE), remote.measure(two, GATE)
        # the runaway check's long generations: greedy and seeded sampling, one request each, so batches
        # cannot differ between the two paths (the seeded one samples from its own generator)
        remote_long = [remote.generate(one, 20, [seed]) for seed in (None, 7)]
        with pytest.raises(KernelloopError, match="max_tokens: an integer from 1 to 1024"):
            remote.generate(one, 5000, [None])
        with pytest.raises(KernelloopError, match="seeds: one per prompt"):
            remote.generate(two, 4, [None])
        remote_probe = remote.invariance(two, 4, 5)
        with pytest.raises(KernelloopError, match="batch: an integer from 1 to 64"):
            remote.invariance(two, 4, 100)
        assert remote.reload() == {}  # nothing committed: nothing changes
    local_one, local_two = local.measure(one, GATE), local.measure(two, GATE)
    local_long = [local.generate(one, 20, [seed]) for seed in (None, 7)]
    local_probe = local.invariance(two, 4, 5)
    assert local_probe == remote_probe  # the same plan, the same fillers, the same tokens
    assert all(c > 0 for c in local_probe["cached"]) and [len(t) for t in local_probe["batch"]] == [4, 4]
    assert local_long == remote_long and all(len(g[0]) <= 20 for g in local_long)
    assert local.generate(one, 20, [7]) == local_long[1] and local_long[0] != local_long[1]  # the seed decides
    local.close()
    for here, there in ((local_one, remote_one), (local_two, remote_two)):
        assert there.greedy == here.greedy and [len(g) for g in here.greedy] == [GATE.max_tokens] * len(here.greedy)
        assert here.tokens_per_second > 0 and there.tokens_per_second > 0
        for a, b in zip(here.logprobs, there.logprobs):
            assert a.dtype == b.dtype == torch.float64 and a.shape == b.shape
            assert not torch.equal(b, b.float().double()), "float64 values must survive the wire, not float32 ones"
        assert mean_kl(here, there) < 1e-8
    # One prompt decodes in the same batches both ways: the same numbers, bit for bit. Several prompts may be
    # batched differently (the server takes them one by one, between steps): float32 rounding apart.
    assert all(torch.equal(a, b) for a, b in zip(local_one.logprobs, remote_one.logprobs))
    for a, b in zip(local_two.logprobs, remote_two.logprobs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class FakeHandle:
    """Any object with the protocol's six methods: records what the loop asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.answer: Measurement | None = None
        self.closed = 0

    def profile(self, workload, progress=lambda message: None):  # noqa: ANN001
        self.calls.append(("profile", len(workload)))
        progress(Step("requests 1/2", "profile requests", 1, 2))
        return {"rows": [], "fake": True}

    def reload(self, revision=None):  # noqa: ANN001
        self.calls.append(("reload", revision))
        return {"rmsnorm": {"float32 *": ["baseline", "registry:x"]}} if revision else {}

    def measure(self, prompt_ids, config, warmup=True):  # noqa: ANN001
        self.calls.append(("measure", len(prompt_ids), config.max_tokens, warmup))
        return Measurement(self.answer.greedy, self.answer.logprobs, 100.0 if warmup else 90.0)

    def generate(self, prompt_ids, max_tokens, seeds):  # noqa: ANN001
        self.calls.append(("generate", len(prompt_ids), max_tokens, tuple(seeds)))
        return [[1, 2, 3] for _ in prompt_ids]

    def invariance(self, prompt_ids, max_tokens, batch):  # noqa: ANN001
        self.calls.append(("invariance", len(prompt_ids), max_tokens, batch))
        same = [[1, 2, 3] for _ in prompt_ids]
        return {"alone": same, "batch": same, "hit": same, "cached": [2] * len(prompt_ids)}

    def close(self) -> None:
        self.closed += 1


def test_the_loop_context_works_with_any_engine_handle(tmp_path: Path, model_dir: Path) -> None:
    fake, messages = FakeHandle(), []
    with History(tmp_path / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp_path / "reg"), proposers={}, model=str(model_dir),
                          engine=fake, gate=GATE, progress=messages.append)
        assert ctx.engine is fake
        assert ctx.profile([object(), object()]) == {"rows": [], "fake": True}
        assert messages[-1] == "  profile: requests 1/2" and isinstance(messages[-1], Step)  # prefixed, still a Step
        reference = ctx.measure_reference()  # always local: float32 torch ops, float64 log-probabilities
        assert ctx.reference.config.kernels == "reference" and ctx.reference.config.dtype == "float32"
        assert all(lp.dtype == torch.float64 for lp in reference.logprobs)
        assert any("starting the reference engine" in m for m in messages)
        fake.answer = reference
        assert summary(ctx.measure_reference(), ctx.measure_engine()) == {"greedy": reference.greedy, "kl": 0.0}
        assert fake.calls[-1] == ("measure", len(GATE.prompts), GATE.max_tokens, True)
        long = ctx.long_generations()  # the gate's first two prompts, greedy and seeded, runaway_tokens long
        assert fake.calls[-1] == ("generate", 4, GATE.runaway_tokens, (None, 1234, None, 1234))
        assert long == {"sampling": ["prompt 0, greedy", "prompt 0, seed 1234", "prompt 1, greedy", "prompt 1, seed 1234"],
                        "outputs": [[1, 2, 3]] * 4}
        assert ctx.batch_invariance()["cached"] == [2, 2]
        assert fake.calls[-1] == ("invariance", 2, GATE.invariance_tokens, GATE.invariance_batch)
        speed = alternate_speed(ctx.tokens_per_second_at, "c^", "c", rounds=2)
        assert speed["ratios"] == [1.0, 1.0]
        assert [c[1] for c in fake.calls if c[0] == "reload"] == ["c^", "c", "c", "c^"]  # alternated
        assert ctx.reload() == {} and fake.calls[-1] == ("reload", None)
        ctx.close()
        assert fake.closed == 1


def test_an_object_without_the_protocol_is_refused(tmp_path: Path) -> None:
    class Partial:
        def profile(self, workload, progress=None):  # noqa: ANN001
            return {}

    with History(tmp_path / "h.db") as history:
        with pytest.raises(TypeError, match="lacks reload, measure, generate, invariance, close"):
            LoopContext(history=history, registry=Registry(tmp_path / "reg"), proposers={}, engine=Partial())


def test_only_the_local_handle_imports_the_engine() -> None:
    """docs/ARCHITECTURE.md: in the agent, agent/local_engine.py is the one module that imports the engine."""
    import ast

    repo = Path(__file__).resolve().parents[1]
    importers = set()
    for path in (repo / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "kernelloop.engine" or n.startswith("kernelloop.engine.") for n in names):
                importers.add(path.relative_to(repo).as_posix())
    assert importers == {"agent/local_engine.py"}
    assert "one module imports the engine: agent/local_engine.py" in (repo / "docs" / "ARCHITECTURE.md").read_text()
