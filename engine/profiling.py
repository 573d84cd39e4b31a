"""Profile start/stop hooks of the engine server.

Between start and stop this records per-step wall time and tokens (from the loop) and, through
the engine's Recorder, seconds per step region and per op call (shape, dtype). `stop` returns the
raw figures under "raw"; the profiler package turns them into shares, buckets and roofline figures.

One engine step can take minutes (interpreted Triton kernels on CPU), so:
- `start` attaches the Recorder between two steps (a step half-recorded would skew every share):
  it answers once the step in flight has ended, with how long it waited. A start while a profile
  records is refused (409): stop it first. A recording has a time limit (`max_seconds`, default
  DEFAULT_MAX_SECONDS) after which it stops by itself, keeping what it had, so a profile whose
  client died never grows without bound; the next stop returns it, marked `auto_stopped`.
- `stop` does not wait for the step in flight: it closes the Recorder from the server's thread,
  keeps the steps that had ended (the Recorder is committed after each one) and answers at once.
  Only a replay of op times (CUDA) runs between two steps, where it always ran.
Every answer carries `engine`: recent step times and queue lengths, for clients to size timeouts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelloop.engine.openai_api import APIError
from kernelloop.engine.recorder import Recorder

if TYPE_CHECKING:
    from kernelloop.engine.loop import EngineLoop

DEFAULT_MAX_SECONDS = 300.0  # a GPU records an event pair per op call: bound what a forgotten profile holds
MAX_MAX_SECONDS = 3600.0
RECENT_STEPS = 64  # step times kept for `engine.step_s_max`


@dataclass
class _Session:
    max_seconds: float
    state: str = "pending"  # pending (waiting for a step boundary) -> recording -> auto-stopped
    recorder: Recorder | None = None
    started: float = 0.0
    steps: list[tuple[float, int]] = field(default_factory=list)  # (seconds, tokens) of each recorded step
    stats_at_start: dict[str, int] = field(default_factory=dict)
    stats_committed: dict[str, int] = field(default_factory=dict)  # engine counters after the last recorded step


def max_seconds_of(body: dict[str, Any] | None) -> float:
    """The recording's time limit asked for in a /profile/start body (400 when unusable)."""
    value = (body or {}).get("max_seconds", DEFAULT_MAX_SECONDS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_MAX_SECONDS:
        raise APIError(400, f"max_seconds must be a number of seconds in (0, {MAX_MAX_SECONDS:g}], not {value!r}",
                       param="max_seconds")
    return float(value)


class StepProfiler:
    def __init__(self, loop: "EngineLoop"):
        self.loop = loop
        self._lock = threading.Lock()  # the loop thread (step hook, attach) vs the server's (start, stop)
        self._session: _Session | None = None
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._last_step_end: float | None = None
        loop.step_hooks.append(self._on_step)

    def engine_state(self) -> dict[str, Any]:
        """What a client needs to size its timeouts; read outside the loop thread, so approximate."""
        engine, now = self.loop.engine, time.perf_counter()
        recent = list(self._recent)
        busy = engine.has_work()
        return {"busy": busy, "running": len(engine.scheduler.running), "waiting": len(engine.scheduler.waiting),
                "step_s_last": recent[-1] if recent else None, "step_s_max": max(recent) if recent else None,
                # while busy, the step in flight began at most this long ago
                "since_last_step_s": now - self._last_step_end if busy and self._last_step_end else None}

    async def start(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        max_seconds = max_seconds_of(body)
        session = _Session(max_seconds)
        with self._lock:
            current = self._session
            if current is not None and current.state == "recording" and not current.recorder.recording():
                current.state = "auto-stopped"  # past its time limit with no step since to notice
                self._detach(current.recorder)
            if current is not None and current.state in ("pending", "recording"):
                ago = f", started {time.perf_counter() - current.started:.0f} s ago" if current.started else ""
                raise APIError(409, f"a profile is already recording{ago}; POST /profile/stop first", code="profile_running")
            discarded = current is not None  # auto-stopped and never collected
            self._session = session
        asked = time.perf_counter()
        started = await self.loop.call(lambda: self._attach(session))
        if not started:
            raise APIError(409, "the profile was stopped before the engine finished its step in flight",
                           code="profile_stopped")
        return {"status": "started", "max_seconds": max_seconds, "waited_s": time.perf_counter() - asked,
                "discarded_auto_stopped": discarded, "engine": self.engine_state()}

    async def stop(self) -> dict[str, Any]:
        with self._lock:
            session, self._session = self._session, None
        if session is None:
            return {"status": "not running", "engine": self.engine_state()}
        if session.recorder is None:  # still waiting for a step boundary: it never records now
            return {"status": "cancelled", "engine": self.engine_state()}
        rec = session.recorder
        rec.recording()  # past its time limit, this closes it as auto-stopped
        rec.close()
        self._detach(rec)
        stopped = rec.closed_at or time.perf_counter()
        raw = await asyncio.to_thread(rec.collect, False)  # CUDA: waits for the GPU, not for the engine loop
        if rec.replays() and raw["ops"]:
            raw = await self.loop.call(lambda: rec.replay(raw))  # kernels run between steps, as the engine's do
        start_stats, end_stats = session.stats_at_start, session.stats_committed
        raw["counters"] = {k: v - start_stats.get(k, 0) for k, v in end_stats.items()}
        raw["variants"] = self.loop.engine.kernels.variants_in_use()
        return {"status": "stopped", "auto_stopped": rec.auto_stopped, "max_seconds": session.max_seconds,
                "engine": self.engine_state(), **summarize_steps(session.steps, stopped - session.started), "raw": raw}

    # -- the loop thread -----------------------------------------------------------------------

    def _attach(self, session: _Session) -> bool:
        engine = self.loop.engine
        with self._lock:
            if self._session is not session:  # stopped while it waited
                return False
            engine.start_recording()
            rec = engine.recorder
            rec.set_time_limit(session.max_seconds)
            session.recorder, session.state, session.started = rec, "recording", time.perf_counter()
            session.stats_at_start = dict(engine.stats)
            session.stats_committed = dict(engine.stats)
            return True

    def _on_step(self, seconds: float, tokens: int) -> None:
        self._recent.append(seconds)
        self._last_step_end = time.perf_counter()
        with self._lock:
            session = self._session
            if session is None or session.state != "recording":
                return
            rec = session.recorder
            if rec.recording():
                session.steps.append((seconds, tokens))
                rec.commit()
                session.stats_committed = dict(self.loop.engine.stats)
            if rec.closed_at is not None:  # its time limit passed: it keeps what it had until a stop
                session.state = "auto-stopped"
                self._detach(rec)

    def _detach(self, rec: Recorder) -> None:
        # Safe from any thread: a step reads engine.recorder once, the Dispatcher its observer once per call.
        engine = self.loop.engine
        if engine.recorder is rec:
            engine.recorder = None
            engine.kernels.observer = None


def summarize_steps(steps: list[tuple[float, int]], wall: float) -> dict[str, Any]:
    busy = sum(s for s, _ in steps)
    tokens = sum(n for _, n in steps)
    ordered = sorted(s for s, _ in steps)
    return {
        "wall_seconds": wall, "steps": len(steps), "busy_seconds": busy, "output_tokens": tokens,
        "tokens_per_second": tokens / wall if wall > 0 else 0.0,
        "step_ms_median": 1e3 * ordered[len(ordered) // 2] if ordered else None,
        "step_ms_max": 1e3 * ordered[-1] if ordered else None,
    }
