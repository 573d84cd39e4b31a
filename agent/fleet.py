"""`FleetEngine`: one engine handle (agent/engine_handle.py) over several serving engines, for
`agent tune/daemon --engine A --engine B ...`.

- profile: every engine is profiled at the same time and the profiles merged (profiler/merge.py), each
  engine weighted by the tokens it has served (its /metrics `kernelloop_generated_tokens_total`, read
  before profiling; the tokens generated while profiled when any engine does not say or none served any).
- reload to HEAD: every engine; one that fails is named in one error. A pinned revision (the gate
  alternating before/after) goes to the gate engine alone, which is the one measured.
- measure / generate / invariance: the gate engine, the first URL (`url`, recorded with the gate's result).

The engines must agree on what is tuned: --kernels registry, device, model directory and registry path
(their /health); a mismatch is one error naming both engines.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import httpx

from kernelloop.agent.engine_handle import check_handle
from kernelloop.agent.gate import Measurement
from kernelloop.agent.gate_config import GateConfig
from kernelloop.common.errors import KernelloopError
from kernelloop.common.progress import Progress, Step
from kernelloop.profiler.merge import merge_profiles
from kernelloop.profiler.workload import WorkloadRequest

SAME = ("kernels", "device", "model_dir", "registry")  # /health fields every engine of a fleet shares
SERVED = re.compile(r"^kernelloop_generated_tokens_total\s+([0-9.eE+-]+)\s*$", re.M)


def served_tokens(handle: Any) -> float | None:
    """The tokens an engine has generated since it started (its /metrics counter); None when it does not say."""
    try:
        match = SERVED.search(httpx.get(f"{handle.url}/metrics", timeout=10).text)
    except httpx.HTTPError:
        return None
    return float(match.group(1)) if match else None


class FleetEngine:
    def __init__(self, engines: Sequence[Any],
                 served: Callable[[Any], float | None] = served_tokens) -> None:
        """`engines`: handles with `url` and `health` (RemoteEngine); the first is the gate engine."""
        if len(engines) < 2:
            raise KernelloopError("a fleet needs at least two engines")
        self.engines = [check_handle(e) for e in engines]
        self.urls = [e.url for e in engines]
        if len(set(self.urls)) < len(self.urls):
            raise KernelloopError(f"an engine is named twice: {', '.join(self.urls)}")
        first = engines[0]
        for other in engines[1:]:
            for key in SAME:
                if other.health.get(key) != first.health.get(key):
                    raise KernelloopError(f"the fleet's engines differ in {key}: {first.url} has "
                                          f"{first.health.get(key)!r}, {other.url} has {other.health.get(key)!r}; "
                                          "every --engine must serve the same model, device and registry")
        self.gate = first
        self.url = first.url  # the gate engine's: what the gate's record names
        self.health: dict[str, Any] = first.health
        self.served = served
        self.reloads: dict[str, dict[str, Any]] = {}  # url -> what its last reload changed

    @classmethod
    def connect(cls, urls: Sequence[str]) -> "FleetEngine":
        """A fleet of RemoteEngines on `urls` (each checked to serve --kernels registry)."""
        from kernelloop.agent.remote import RemoteEngine

        return cls([RemoteEngine(url) for url in urls])

    def _each(self, call: Callable[[Any], Any], engines: Sequence[Any] | None = None) -> list[tuple[Any, Any, Exception | None]]:
        """(engine, result, error) of `call` on every engine, run at the same time."""
        engines = self.engines if engines is None else engines

        def one(engine: Any) -> tuple[Any, Any, Exception | None]:
            try:
                return engine, call(engine), None
            except Exception as exc:  # noqa: BLE001  (reported per engine by the caller)
                return engine, None, exc

        with ThreadPoolExecutor(len(engines)) as pool:
            return list(pool.map(one, engines))

    def profile(self, workload: list[WorkloadRequest], progress: Progress = lambda message: None) -> dict[str, Any]:
        counts = [self.served(e) for e in self.engines]
        lock = threading.Lock()
        results = self._each(lambda e: e.profile(workload, _labelled(progress, e.url, lock)))
        failed = [(e.url, exc) for e, _, exc in results if exc is not None]
        if failed:
            raise KernelloopError("; ".join(f"profiling {url} failed: {exc}" for url, exc in failed))
        weights = None if any(c is None for c in counts) or not sum(counts) else counts  # type: ignore[arg-type]
        return merge_profiles([profile for _, profile, _ in results], weights)

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        """HEAD: every engine (an engine that fails is named); a pinned revision: the gate engine only.
        Returns what changed, the gate engine's figures first."""
        results = self._each(lambda e: e.reload(revision), None if revision is None else [self.gate])
        failed = [(e.url, exc) for e, _, exc in results if exc is not None]
        done = [e.url for e, _, exc in results if exc is None]
        for e, changed, exc in results:
            if exc is None:
                self.reloads[e.url] = changed
        if failed:
            raise KernelloopError("; ".join(f"engine {url} did not reload its kernels: {exc}" for url, exc in failed)
                                  + (f" (reloaded: {', '.join(done)})" if done else ""))
        changed: dict[str, Any] = {}
        for _, each, _ in results:
            for op, buckets in each.items():
                for bucket, change in buckets.items():
                    changed.setdefault(op, {}).setdefault(bucket, change)
        return changed

    def measure(self, prompt_ids: list[list[int]], config: GateConfig, warmup: bool = True) -> Measurement:
        return self.gate.measure(prompt_ids, config, warmup)

    def generate(self, prompt_ids: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]:
        return self.gate.generate(prompt_ids, max_tokens, seeds)

    def invariance(self, prompt_ids: list[list[int]], max_tokens: int, batch: int) -> dict[str, Any]:
        return self.gate.invariance(prompt_ids, max_tokens, batch)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


def _labelled(progress: Progress, label: str, lock: threading.Lock) -> Progress:
    """`progress` for one engine among several reporting from threads: one at a time, its own bars."""
    def report(message: str) -> None:
        text = f"{label}: {message}"
        with lock:
            progress(Step(text, f"{label} {message.task}", message.done, message.total, message.deadline,
                          message.detail, message.log) if isinstance(message, Step) else text)
    return report
