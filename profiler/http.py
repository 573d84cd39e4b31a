"""Profiling a running engine over HTTP: /profile/start, the workload as streamed chat requests,
/profile/stop. A dead engine ends the profile (marked partial), never hangs it; a slow one is waited for.

Timing follows the engine, whose steps can take minutes (interpreted kernels on CPU):
- /profile/start answers at the engine's next step boundary; it is given at least
  START_WAIT_MIN_S, or STEP_FACTOR times the longest step the engine reports (from /profile/stop).
- The window is `seconds`, extended while no token has come back (a recording without one finished
  step has no figures) by up to max(FIRST_TOKEN_WAIT_MIN_S, STEP_FACTOR x step). Then every request
  still streaming is cancelled: its connection closes and the engine aborts it. /profile/stop answers
  without waiting for the step in flight, and the driver waits (same scaling) until the engine has
  dropped the cancelled requests, so the next profile starts on an engine free of them.
- The recording is started with a time limit (`max_seconds`), so a driver killed mid-way leaves
  nothing that grows on the engine.
The profile's `notes` say what was waited for, extended and cancelled.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

import httpx

from kernelloop.common.errors import KernelloopError
from kernelloop.common.progress import Progress, Step
from kernelloop.engine.recorder import REPLAY_BUDGET_S
from kernelloop.kernels.device import default_device, device_fingerprint
from kernelloop.kernels.roofline import device_rates
from kernelloop.profiler.profile import assemble
from kernelloop.profiler.workload import WorkloadRequest, summarize_latencies

CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 30.0  # /health, /v1/models, /profile/stop: none of them waits for an engine step
START_WAIT_MIN_S = 120.0
FIRST_TOKEN_WAIT_MIN_S = 300.0
DRAIN_WAIT_MIN_S = 30.0
STEP_FACTOR = 4.0  # waits for an engine step: this many times the longest step it reported
MAX_RECORDING_S = 3600.0  # the engine's ceiling on a recording's time limit
POLL_S = 0.1

T = TypeVar("T")


class EngineUnreachable(KernelloopError):
    pass


@dataclass
class _Traffic:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    done: int = 0
    sent: int = 0
    in_flight: int = 0


def step_seconds(engine: dict[str, Any] | None) -> float:
    """The longest of the engine's recent steps, 0 if it reported none."""
    return (engine or {}).get("step_s_max") or 0.0


def profile_url(url: str, workload: list[WorkloadRequest], *, concurrency: int = 8, seconds: float = 120.0,
                progress: Progress = lambda message: None) -> dict[str, Any]:
    coro = _profile(url.rstrip("/"), workload, concurrency, seconds, progress)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:  # called from inside an event loop: ours runs in a thread
        return pool.submit(asyncio.run, coro).result()


async def _profile(url: str, workload: list[WorkloadRequest], concurrency: int, seconds: float,
                   progress: Progress) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), limits=limits) as client:
        try:
            health = (await client.get(f"{url}/health")).json()
            model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise EngineUnreachable(f"cannot reach a kernelloop engine at {url}: {exc}") from None
        notes: list[str] = []
        engine = await _start(client, url, seconds, notes, progress)
        others = (engine.get("running") or 0) + (engine.get("waiting") or 0)  # requests of other clients
        start = time.perf_counter()
        traffic, cut_reason = await _drive(client, url, model, workload, concurrency, seconds, step_seconds(engine),
                                           notes, progress)
        wall = time.perf_counter() - start
        raw, reason, stopped = await _stop(client, url, step_seconds(engine))
        if traffic.in_flight:
            await _drain(client, url, traffic.in_flight, others,
                         max(step_seconds(engine), step_seconds(stopped.get("engine"))), notes)
    if stopped.get("auto_stopped"):
        notes.append(f"the engine stopped recording by itself at its {stopped.get('max_seconds', 0):g} s limit")
    if not reason and stopped.get("status") == "stopped" and not stopped.get("steps"):
        reason = "no engine step finished while recording: nothing was measured"
    reason = (f"a request failed ({traffic.failures[0]})" if traffic.failures else "") or reason or cut_reason
    device = health.get("device", "unknown")
    local = default_device()
    # the roofline is measured here, so it describes the engine only when the engine runs on this device
    rates = (lambda dtype: device_rates(local, dtype)) if device == device_fingerprint(local) else None
    return assemble(raw, fingerprint=device, engine=url, model=model, kernels=health.get("kernels", "unknown"),
                    wall_seconds=wall, requests=traffic.done, latencies=summarize_latencies(traffic.ttft, traffic.tpot),
                    rates=rates, partial_reason=reason, notes=notes, auto_stopped=bool(stopped.get("auto_stopped")),
                    cancelled_requests=traffic.in_flight)


async def _start(client: httpx.AsyncClient, url: str, seconds: float, notes: list[str], progress: Progress) -> dict[str, Any]:
    """Start recording at the engine's next step boundary; the engine's state as it answered."""
    try:
        cleared = (await client.post(f"{url}/profile/stop")).json()  # a profile left recording would refuse ours
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineUnreachable(f"{url} did not start profiling: {type(exc).__name__}: {exc}") from None
    if cleared.get("status") == "stopped":
        notes.append("stopped a profile that another client had left recording")
    step = step_seconds(cleared.get("engine"))
    wait = max(START_WAIT_MIN_S, STEP_FACTOR * step)
    # a killed driver's recording stops by itself shortly after this one would have ended
    limit = min(MAX_RECORDING_S, seconds + max(FIRST_TOKEN_WAIT_MIN_S, STEP_FACTOR * step) + wait)
    asked = time.perf_counter()
    try:
        response = await _ticking(client.post(f"{url}/profile/start", json={"max_seconds": limit},
                                              timeout=httpx.Timeout(wait, connect=CONNECT_TIMEOUT_S)),
                                  lambda s: f"waiting for the engine to finish its step in flight ({s:.0f} s)", progress)
        body = response.json()
    except httpx.TimeoutException:
        await _quietly(client.post(f"{url}/profile/stop"))  # withdraw the start still queued on the engine
        raise EngineUnreachable(f"{url} did not start profiling: its step in flight had not ended after {wait:.0f} s "
                                f"(its recent steps took up to {step:.1f} s); retry when it is less busy") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineUnreachable(f"{url} did not start profiling: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200 or body.get("status") != "started":
        message = (body.get("error") or {}).get("message") or body.get("status") or response.status_code
        raise EngineUnreachable(f"{url} did not start profiling: {message}")
    waited = time.perf_counter() - asked
    if waited >= 1.0:
        notes.append(f"waited {waited:.1f} s for the engine to finish its step in flight before recording")
    return body.get("engine") or cleared.get("engine") or {}


async def _drive(client: httpx.AsyncClient, url: str, model: str, workload: list[WorkloadRequest], concurrency: int,
                 seconds: float, step: float, notes: list[str], progress: Progress) -> tuple[_Traffic, str]:
    """Run the workload for the window; cancel what is still streaming at its end. (traffic, why it was cut)."""
    traffic = _Traffic()
    gate = asyncio.Semaphore(concurrency)
    window_ends = time.monotonic() + seconds  # the bars' time left (the window may be extended, below)

    async def one(w: WorkloadRequest) -> None:
        async with gate:
            if traffic.failures:
                return
            traffic.sent += 1
            traffic.in_flight += 1
            try:
                per_token = await _stream_one(client, url, model, w, traffic)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                traffic.failures.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
                return
            finally:
                traffic.in_flight -= 1
        traffic.done += 1
        if per_token is not None:
            traffic.tpot.append(per_token)
        progress(Step(f"{traffic.done}/{len(workload)} requests done", "profile requests", traffic.done, len(workload),
                      window_ends))

    tasks = [asyncio.create_task(one(w)) for w in workload]
    await _until(lambda: False, tasks, seconds)
    reason = ""
    if not all(t.done() for t in tasks) and not traffic.ttft and not traffic.failures:
        extension = max(FIRST_TOKEN_WAIT_MIN_S, STEP_FACTOR * step)
        progress(f"no token back after {seconds:g} s; waiting up to {extension:.0f} s more for the engine's first step")
        extended = time.perf_counter()
        window_ends = time.monotonic() + extension
        await _until(lambda: bool(traffic.ttft or traffic.failures), tasks, extension)
        took = time.perf_counter() - extended
        notes.append(f"window extended by {took:.1f} s: no token had come back after {seconds:g} s")
        if not traffic.ttft:
            reason = f"no token came back in {seconds + took:.0f} s: the engine did not finish a step"
    cancelled = traffic.in_flight
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    traffic.in_flight = cancelled  # as it was at the cut (the cancelled tasks count themselves out)
    unsent = len(workload) - traffic.sent
    if cancelled or unsent:
        reason = reason or f"stopped after {seconds:g} s with {traffic.done}/{len(workload)} requests done"
        why = "after a request failed" if traffic.failures else "cut at the time limit"
        notes.append(f"{why}: {cancelled} requests in flight cancelled, {unsent} never sent")
    return traffic, reason


async def _stream_one(client: httpx.AsyncClient, url: str, model: str, w: WorkloadRequest,
                      traffic: _Traffic) -> float | None:
    """Time per output token of one streamed chat request (its time to first token goes into
    `traffic` as it arrives: a request cut by the window has one too). No read timeout:
    the window's end cancels it (closing the connection, which makes the engine abort it)."""
    body = {"model": model, "messages": w.messages, "max_tokens": w.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = last = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                last = time.perf_counter()
                if first is None:
                    first = last
                    traffic.ttft.append(first - start)
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return (last - first) / (w.max_tokens - 1) if w.max_tokens > 1 else None


async def _stop(client: httpx.AsyncClient, url: str, step: float) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(raw figures, why they are missing, the whole answer). Stop answers without waiting for the
    step in flight; only a replay of op times (GPU) waits for a step boundary."""
    timeout = CALL_TIMEOUT_S + REPLAY_BUDGET_S + STEP_FACTOR * step
    try:
        body = (await client.post(f"{url}/profile/stop", timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S))).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {}, f"the engine stopped answering ({type(exc).__name__}); per-op figures are lost", {}
    if body.get("status") != "stopped":
        return {}, f"the engine was no longer recording ({body.get('status')}: stopped by another client or a restart)", body
    return body.get("raw") or {}, "", body


async def _drain(client: httpx.AsyncClient, url: str, cancelled: int, others: int, step: float,
                 notes: list[str]) -> None:
    """Wait until the engine has dropped the cancelled requests (it does so between two steps, and
    /metrics answers between two steps), so that no later profile measures them."""
    wait = max(DRAIN_WAIT_MIN_S, STEP_FACTOR * step)
    asked = time.perf_counter()
    while (left := wait - (time.perf_counter() - asked)) > 0:
        queued = await _queued(client, url, left)
        if queued is None:
            break  # no answer in time, or no /metrics to read
        if queued <= others:
            notes.append(f"the engine aborted the {cancelled} cancelled requests; it was free of them after "
                         f"{time.perf_counter() - asked:.1f} s")
            return
        await asyncio.sleep(POLL_S)
    notes.append(f"the engine had not dropped the {cancelled} cancelled requests after {wait:.0f} s; "
                 "it aborts them at its next step boundary")


async def _queued(client: httpx.AsyncClient, url: str, timeout: float) -> int | None:
    """Requests running or waiting on the engine (from /metrics), None if it did not say in time."""
    try:
        text = (await client.get(f"{url}/metrics", timeout=httpx.Timeout(max(timeout, 1.0), connect=CONNECT_TIMEOUT_S))).text
    except httpx.HTTPError:
        return None
    counts = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(("kernelloop_running_requests ", "kernelloop_waiting_requests "))]
    return int(sum(counts)) if len(counts) == 2 else None


async def _until(condition: Callable[[], bool], tasks: list[asyncio.Task], timeout: float) -> None:
    """Wait until every task is done, `condition()` holds, or `timeout` seconds passed."""
    end = time.perf_counter() + timeout
    while not condition():
        pending = [t for t in tasks if not t.done()]
        left = end - time.perf_counter()
        if not pending or left <= 0:
            return
        await asyncio.wait(pending, timeout=min(left, POLL_S))


async def _ticking(awaitable: Awaitable[T], message: Callable[[float], str], progress: Progress) -> T:
    """`awaitable`'s result; after a second, `progress(message(seconds waited))` once a second."""
    task = asyncio.ensure_future(awaitable)
    start = time.perf_counter()
    while not task.done():
        await asyncio.wait([task], timeout=1.0)
        if not task.done():
            progress(message(time.perf_counter() - start))
    return task.result()


async def _quietly(coro: Coroutine[Any, Any, Any]) -> None:
    try:
        await coro
    except httpx.HTTPError:
        pass
