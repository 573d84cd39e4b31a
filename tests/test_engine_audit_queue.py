"""The engine's shadow-audit queue: seeded sampling, the ring and its cursor, and the /audit routes."""

from __future__ import annotations

import json

import httpx
import pytest

from kernelloop.engine.audit_queue import AUDIT_TOP, AuditQueue, asks_for_json
from kernelloop.engine.openai_api import ChatRequest
from kernelloop.engine.sampler import TokenLogprobs
from kernelloop.kernels.device import CPU


def add(queue: AuditQueue, n: int) -> None:
    for i in range(n):
        queue.add(f"r{i}", [1, 2], [3, i], [None, None], "abc", True, False)


def test_sampling_is_seeded_and_rate_zero_takes_nothing() -> None:
    first, second = AuditQueue(0.25, seed=7), AuditQueue(0.25, seed=7)
    a, b = [first.admit() for _ in range(400)], [second.admit() for _ in range(400)]
    assert a == b and 60 < sum(a) < 140
    assert not any(AuditQueue(0.0).admit() for _ in range(200))
    assert all(AuditQueue(1.0).admit() for _ in range(50))
    with pytest.raises(ValueError):
        AuditQueue(1.5)


def test_the_ring_keeps_the_newest_and_counts_what_the_cursor_missed() -> None:
    queue = AuditQueue(1.0, capacity=4)
    add(queue, 6)
    samples, nxt, missed, latest = queue.since(0)
    assert [s.seq for s in samples] == [2, 3, 4, 5] and (nxt, missed, latest) == (6, 2, 6)
    samples, nxt, missed, latest = queue.since(5)
    assert [s.request_id for s in samples] == ["r5"] and missed == 0
    assert queue.since(9) == ([], 6, 0, 6)  # a cursor past latest: the auditor sees the engine restarted


def test_served_logprobs_keep_the_audit_top_k() -> None:
    queue = AuditQueue(1.0)
    lp = TokenLogprobs(3, -0.1, [(t, -0.1 * t) for t in range(12)])
    sample = queue.add("r", [1], [3], [lp], None, False, True)
    assert len(sample.served_logprobs[0]["top"]) == AUDIT_TOP and sample.commit is None
    assert json.loads(json.dumps(sample.to_json()))["json_asked"] is True


def test_json_is_asked_by_response_format_only() -> None:
    def chat(fmt: dict | None) -> ChatRequest:
        return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                           **({"response_format": fmt} if fmt else {})})

    assert asks_for_json(chat({"type": "json_object"})) and asks_for_json(chat({"type": "json_schema", "json_schema": {}}))
    assert not asks_for_json(chat({"type": "text"})) and not asks_for_json(chat(None))


def test_results_posted_back_show_in_the_metrics_lines() -> None:
    queue = AuditQueue(0.01)
    queue.post_results({"commits": {"abc123": {"samples": 7, "agreement": 0.5, "kl": None, "loop_rate": 0.0}},
                        "rolled_back": [{"commit": "abc123", "reason": "r"}]})
    text = "\n".join(queue.metrics_lines())
    assert 'kernelloop_audit_agreement{commit="abc123"} 0.5' in text and "kernelloop_audit_rollbacks_total 1" in text
    assert "kernelloop_audit_kl" not in text and "kernelloop_audit_rate 0.01" in text


def test_the_server_samples_finished_requests_streamed_or_not(embedded_model_dir) -> None:
    from kernelloop.engine.engine import Engine, EngineConfig

    from tests.serving import serve

    engine = Engine(EngineConfig(model=str(embedded_model_dir)))
    with serve(engine, "m", AuditQueue(1.0)) as (base, _):
        body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        whole = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True, "logprobs": 2}, timeout=60) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
        reply = httpx.get(f"{base}/audit/samples", params={"since": 0}, timeout=30).json()
        assert [s["prompt_ids"] for s in reply["samples"]] == [[5, 6, 7], [5, 6, 7]]
        assert [len(s["served_ids"]) for s in reply["samples"]] == [4, 4] and reply["latest"] == 2
        assert whole["usage"]["completion_tokens"] == 4 and reply["samples"][0]["served_logprobs"] is None
        assert len(reply["samples"][1]["served_logprobs"]) == 4 and all(s["greedy"] for s in reply["samples"])
        assert httpx.get(f"{base}/audit/samples", params={"since": -1}, timeout=30).status_code == 400
        assert httpx.post(f"{base}/audit/results", json=[1], timeout=30).status_code == 400


@pytest.mark.parametrize("argv,needle", [(["--audit-rate", "2"], "--audit-rate"),
                                         (["--kernels", "reference", "--fallback", "reference"], "--fallback")])
def test_bad_audit_and_fallback_flags_are_one_line_and_exit_2(argv, needle, capsys) -> None:
    from kernelloop.engine import cli

    assert cli.main(["serve", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_the_dispatcher_knows_the_commit_it_serves_and_falls_back_to_the_reference(registry) -> None:
    from kernelloop.kernels.dispatch import Dispatcher
    from kernelloop.kernels.ops import OPS

    from tests.test_audit_rollback import CLEAN, commit

    first = commit(registry, CLEAN, 1.1)
    kd = Dispatcher("registry", registry=registry, device=CPU, fallback="reference")
    assert kd.commit == first
    second = commit(registry, CLEAN.replace("# expect: control", "# expect: control (2)"), 1.2)
    assert kd.commit == first and kd.reload() is not None and kd.commit == second
    kd.reload("HEAD~1")
    assert kd.commit == first  # a pinned revision (the gate's) is served under its full sha
    names = lambda op: [v.name for v in kd.resolve(OPS[op], "float32", "*")]  # noqa: E731
    assert names("silu_mul") == ["reference"] and names("rmsnorm")[1:] == ["reference"]
    assert [v.name for v in Dispatcher("registry", registry=registry, device=CPU).resolve(
        OPS["silu_mul"], "float32", "*")] == ["baseline", "reference"]
