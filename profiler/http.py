"""Profiling a running engine over HTTP: /profile/start, the workload as streamed chat requests,
/profile/stop. Every call has a timeout, so a dead engine ends the profile (marked partial), never hangs it."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx

from engine.recorder import REPLAY_BUDGET_S
from kernels.device import default_device, device_fingerprint
from kernels.errors import KernelloopError
from kernels.roofline import device_rates
from profiler.profile import assemble
from profiler.workload import WorkloadRequest, summarize_latencies

CONNECT_TIMEOUT_S = 5.0
# /profile/stop on a GPU engine replays each observed op shape (engine/recorder.py) before answering
STOP_TIMEOUT_S = 30.0 + REPLAY_BUDGET_S


class EngineUnreachable(KernelloopError):
    pass


def _stream_one(client: httpx.Client, url: str, model: str, w: WorkloadRequest, timeout: float) -> tuple[float, float | None]:
    """(time to first token, time per output token) of one streamed chat request."""
    body = {"model": model, "messages": w.messages, "max_tokens": w.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = last = None
    chunks = 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                last = time.perf_counter()
                first = first or last
                chunks += 1
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first - start, (last - first) / (w.max_tokens - 1) if w.max_tokens > 1 else None


def profile_url(url: str, workload: list[WorkloadRequest], *, concurrency: int = 8, seconds: float = 120.0,
                progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    url = url.rstrip("/")
    client = httpx.Client(timeout=httpx.Timeout(30.0, connect=CONNECT_TIMEOUT_S))
    try:
        health = client.get(f"{url}/health").json()
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise EngineUnreachable(f"cannot reach a kernelloop engine at {url}: {exc}") from None
    try:
        client.post(f"{url}/profile/stop")  # a profile left running by someone else would swallow ours
        client.post(f"{url}/profile/start").raise_for_status()
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"{url} did not start profiling: {exc}") from None
    start = time.perf_counter()
    deadline = start + seconds
    ttft: list[float] = []
    tpot: list[float] = []
    failures: list[str] = []

    def run(w: WorkloadRequest) -> None:
        remaining = deadline - time.perf_counter()
        if remaining <= 0 or failures:
            return
        try:
            first, per_token = _stream_one(client, url, model, w, timeout=min(remaining, 60.0))
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            if time.perf_counter() >= deadline - 0.5:
                return  # cut by the time limit, not a failure of the engine
            failures.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
            return
        ttft.append(first)
        if per_token is not None:
            tpot.append(per_token)
        progress(f"{len(ttft)}/{len(workload)} requests done")

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(run, workload))
    wall = time.perf_counter() - start
    raw: dict[str, Any] = {}
    reason = f"a request failed ({failures[0]})" if failures else ""
    if time.perf_counter() > deadline and len(ttft) < len(workload):
        reason = reason or f"stopped after {seconds:g} s with {len(ttft)}/{len(workload)} requests done"
    try:
        raw = client.post(f"{url}/profile/stop", timeout=STOP_TIMEOUT_S).json().get("raw") or {}
    except (httpx.HTTPError, ValueError) as exc:
        reason = f"the engine stopped answering ({type(exc).__name__}); per-op figures are lost"
    finally:
        client.close()
    device = health.get("device", "unknown")
    local = default_device()
    # the roofline is measured here, so it describes the engine only when the engine runs on this device
    rates = (lambda dtype: device_rates(local, dtype)) if device == device_fingerprint(local) else None
    return assemble(raw, device=device, engine=url, model=model, kernels=health.get("kernels", "unknown"),
                    wall_seconds=wall, requests=len(ttft), latencies=summarize_latencies(ttft, tpot),
                    rates=rates, partial_reason=reason)
