"""Profiling a slow engine over HTTP: a real engine (embedded model) whose forward is made
slow on purpose, so steps take as long as interpreted kernels make them, deterministically."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import kernelloop.profiler.http as http_driver
from kernelloop.agent.commands.profile import show
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.profiler.analysis import profile_rows
from kernelloop.profiler.http import profile_url
from kernelloop.profiler.workload import agent_workload

from tests.serving import serve


class SlowForward:
    """The model's forward, then `delay` seconds of sleep. The `hold_at`-th call, once computed,
    waits for `release`: a step frozen half-way, its op calls already recorded."""

    def __init__(self, forward: Any, delay: float = 0.0, hold_at: int | None = None) -> None:
        self.forward, self.delay, self.hold_at = forward, delay, hold_at
        self.calls = 0
        self.held, self.release = threading.Event(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.forward(*args, **kwargs)
        self.calls += 1
        if self.calls == self.hold_at:
            self.held.set()
            self.release.wait(30)
        time.sleep(self.delay)
        return out


@pytest.fixture(scope="module")
def engine(embedded_model_dir: Path) -> Engine:
    return Engine(EngineConfig(model=str(embedded_model_dir)))


def slow(engine: Engine, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> SlowForward:
    wrapper = SlowForward(engine.model.forward, **kwargs)
    monkeypatch.setattr(engine.model, "forward", wrapper)
    return wrapper


def complete(base: str, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", timeout=60, json={"model": "embedded", "prompt": "Hello there",
                                                                   "max_tokens": max_tokens, "ignore_eos": True})


def linear_calls_per_forward(engine: Engine) -> int:
    return 4 * engine.model_config.num_layers + 1  # qkv, o, gate_up, down per layer; lm_head


def check_raw(engine: Engine, body: dict) -> None:
    """Only whole steps are in the figures: every recorded forward has all its projections, no more."""
    raw = body["raw"]
    forwards = raw["regions"]["forward"]["calls"]
    assert forwards == body["steps"] > 0
    linear = sum(o["calls"] for o in raw["ops"] if o["op"] == "linear")
    assert linear == forwards * linear_calls_per_forward(engine)
    rows = profile_rows(raw, rates=None)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0) and any(r["kind"] == "op" for r in rows)


def test_stop_answers_during_a_long_step_with_the_steps_that_ended(engine: Engine, monkeypatch) -> None:
    frozen = slow(engine, monkeypatch, hold_at=5)
    with serve(engine, "embedded") as (base, _):
        assert httpx.post(f"{base}/profile/start", timeout=10).json()["status"] == "started"
        request = threading.Thread(target=complete, args=(base, 20))
        request.start()
        try:
            assert frozen.held.wait(20)  # the 5th forward has run its ops and now takes "minutes"
            asked = time.perf_counter()
            body = httpx.post(f"{base}/profile/stop", timeout=5).json()
            took = time.perf_counter() - asked
        finally:
            frozen.release.set()
            request.join(60)
    assert body["status"] == "stopped" and not body["auto_stopped"] and took < 3
    assert body["steps"] == 4  # the frozen step is not in the figures, not even its op calls
    check_raw(engine, body)
    assert engine.recorder is None and engine.kernels.observer is None


def test_a_slow_engine_profiles_and_the_next_profile_starts(engine: Engine, monkeypatch, capsys) -> None:
    slow(engine, monkeypatch, delay=0.25)
    workload = agent_workload(6, seed=3, max_tokens=(30, 30))  # 30 steps of 0.25 s each: cut by a 2 s window
    with serve(engine, "embedded") as (base, _):
        first = profile_url(base, workload, concurrency=3, seconds=2.0)
        assert not engine.has_work() and not engine.requests  # the cut requests were aborted, not left running
        second = profile_url(base, workload, concurrency=3, seconds=2.0)
    for profile in (first, second):
        assert profile["partial"] and profile["partial_reason"].startswith("stopped after 2 s")
        assert any(r["kind"] == "op" and r["calls"] > 0 for r in profile["rows"])
        assert profile["cancelled_requests"] == 3 and profile["output_tokens"] > 0
        notes = " | ".join(profile["notes"])
        assert "3 requests in flight cancelled, 3 never sent" in notes
        assert "the engine aborted the 3 cancelled requests" in notes
        assert profile["wall_seconds"] < 4
    show(second)
    assert "note: cut at the time limit" in capsys.readouterr().out


def test_timeouts_follow_the_engine_step_time(engine: Engine, monkeypatch) -> None:
    """A start that waits for a step in flight longer than the fixed minimum, and a window shorter
    than a step: both scaled to the step time the engine reports, so the profile has figures."""
    monkeypatch.setattr(http_driver, "START_WAIT_MIN_S", 0.2)
    slow(engine, monkeypatch, delay=0.8)
    with serve(engine, "embedded") as (base, _):
        before = engine.stats["forwards"]
        other = threading.Thread(target=complete, args=(base, 4))  # another client: steps of 0.8 s in flight
        other.start()
        deadline = time.time() + 20
        while engine.stats["forwards"] < before + 2 and time.time() < deadline:  # one step ended, one in flight
            time.sleep(0.01)
        profile = profile_url(base, agent_workload(2, seed=4, max_tokens=(3, 3)), concurrency=2, seconds=0.3)
        other.join(60)
    assert any(r["kind"] == "op" for r in profile["rows"]) and profile["steps"] > 0
    assert any(n.startswith("window extended by") for n in profile["notes"]), profile["notes"]
    assert profile["cancelled_requests"] == 2 and profile["requests"] == 0
    assert profile["ttft_ms_median"] > 0  # first tokens of requests the window cut count too


def test_a_recording_stops_by_itself_at_its_time_limit(engine: Engine, monkeypatch) -> None:
    slow(engine, monkeypatch, delay=0.05)
    with serve(engine, "embedded") as (base, _):
        assert httpx.post(f"{base}/profile/start", json={"max_seconds": 0.6}, timeout=10).json()["status"] == "started"
        again = httpx.post(f"{base}/profile/start", timeout=10)
        assert again.status_code == 409 and "already recording" in again.json()["error"]["message"]
        assert complete(base, 30).status_code == 200  # ~1.5 s of steps: the limit falls mid-way
        assert engine.recorder is None and engine.kernels.observer is None  # nothing grows any more
        body = httpx.post(f"{base}/profile/stop", timeout=10).json()
        assert httpx.post(f"{base}/profile/stop", timeout=10).json()["status"] == "not running"

        # never stopped by anyone, and no traffic: the next start replaces it, saying so
        assert httpx.post(f"{base}/profile/start", json={"max_seconds": 0.2}, timeout=10).status_code == 200
        time.sleep(0.4)
        restarted = httpx.post(f"{base}/profile/start", timeout=10).json()
        idle = httpx.post(f"{base}/profile/stop", timeout=10).json()
        bad = [httpx.post(f"{base}/profile/start", json={"max_seconds": v}, timeout=10) for v in (-1, "x", 1e9)]
    assert body["status"] == "stopped" and body["auto_stopped"] and body["max_seconds"] == 0.6
    assert 0.6 <= body["wall_seconds"] < 1.2 and 0 < body["output_tokens"] < 30
    check_raw(engine, body)
    assert restarted["status"] == "started" and restarted["discarded_auto_stopped"]
    assert idle["status"] == "stopped" and not idle["auto_stopped"]
    assert all(r.status_code == 400 and "max_seconds" in r.json()["error"]["message"] for r in bad)


def test_an_idle_recording_past_its_limit_is_auto_stopped(engine: Engine) -> None:
    with serve(engine, "embedded") as (base, _):
        httpx.post(f"{base}/profile/start", json={"max_seconds": 0.2}, timeout=10).raise_for_status()
        time.sleep(0.4)
        body = httpx.post(f"{base}/profile/stop", timeout=10).json()
    assert body["status"] == "stopped" and body["auto_stopped"] and body["steps"] == 0
    assert engine.recorder is None
