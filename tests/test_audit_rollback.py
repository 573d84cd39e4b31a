"""The shadow audit against a live engine: a registry commit made behind the gate's back that breaks rmsnorm
is rolled back from what the engine served; a clean commit stays. Embedded model, in-process server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kernelloop.agent.auditor import Auditor, EngineAudit
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.shadow_audit import AuditConfig
from kernelloop.engine.audit_queue import AuditQueue
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.history import History
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import Provenance

from tests.serving import serve

CANDIDATES = Path(__file__).parent / "sandbox_candidates"
CLEAN = (CANDIDATES / "control_rmsnorm_row.py").read_text()
# The planted regression: the same kernel with its output negated and tripled, committed without the gate.
BROKEN = CLEAN.replace("y = x * tl.rsqrt(ms + eps) * w", "y = -3.0 * x * tl.rsqrt(ms + eps) * w")
PROMPTS = [[5 + i, 17, 40 + 3 * i, 9, 60 + i] for i in range(6)]


def commit(reg: Registry, source: str, speedup: float) -> str:
    """A registry commit as a person (or a bug) would make it: straight to the registry, no gate."""
    return reg.add("rmsnorm", source, device="cpu-interpreter", dtype="float32", bucket="*", speedup=speedup,
                   speedup_ci=(speedup - 0.1, speedup + 0.1), provenance=Provenance("human")).commit


def traffic(base: str, n: int = len(PROMPTS)) -> None:
    for i, prompt in enumerate(PROMPTS[:n]):
        body = {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        if i % 2:
            body["logprobs"] = 8  # the served top-k: the audit's KL
        assert httpx.post(f"{base}/v1/completions", json=body, timeout=120).status_code == 200


@pytest.fixture
def setup(embedded_model_dir, tmp_path):
    reg = Registry(tmp_path / "registry")
    commit(reg, CLEAN, 1.1)  # the registry's first commit (never rolled back): the clean baseline
    engine = Engine(EngineConfig(model=str(embedded_model_dir), kernels="registry", registry=str(reg.path),
                                 fallback="reference"))
    reference = LocalEngine(model=str(embedded_model_dir), kernels="reference", dtype="float32")
    with History(tmp_path / "h.db") as history, serve(engine, "m", AuditQueue(1.0, seed=0)) as (base, _):
        auditor = Auditor(EngineAudit(base, timeout_s=120), reference, reg, history, AuditConfig(window=6, min_samples=4))
        yield base, reg, history, auditor


@pytest.mark.slow
def test_a_clean_commit_stays_and_a_planted_regression_is_rolled_back(setup) -> None:
    base, reg, history, auditor = setup
    clean = commit(reg, CLEAN.replace("# expect: control", "# expect: control (again)"), 1.2)
    httpx.post(f"{base}/kernels/reload", timeout=60).raise_for_status()
    traffic(base)
    result = auditor.poll()
    assert result.scored == len(PROMPTS) and not result.rolled_back
    fig = result.figures[clean]
    assert fig["agreement"] == 1.0 and fig["kl"] < 1e-3 and fig["loop_rate"] == 0
    assert reg.head() == clean

    planted = commit(reg, BROKEN, 1.5)
    httpx.post(f"{base}/kernels/reload", timeout=60).raise_for_status()
    traffic(base)
    result = auditor.poll()
    assert [r["commit"] for r in result.rolled_back] == [planted]
    assert "agreement" in result.rolled_back[0]["reason"]
    assert reg.head() not in (planted, clean) and reg.entries()[0].sha256 == reg.entries(clean)[0].sha256
    event = history.registry_events()[0]
    assert event["kind"] == "rollback" and event["op"] == "rmsnorm" and event["ok"]
    assert event["detail"]["audited_commit"] == planted and "agreement" in event["detail"]["reason"]
    metrics = httpx.get(f"{base}/metrics", timeout=30).text
    assert "kernelloop_audit_rollbacks_total 1" in metrics
    assert f'kernelloop_audit_agreement{{commit="{planted}"}}' in metrics

    traffic(base, 4)  # served by the revert commit now the engine reloaded: judged clean, nothing more undone
    result = auditor.poll()
    assert not result.rolled_back and result.figures[reg.head()]["agreement"] == 1.0
    assert len(history.audit_samples()) == 2 * len(PROMPTS) + 4
