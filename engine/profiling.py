"""Profile start/stop hooks of the engine server.

Between start and stop this records per-step wall time and tokens (from the loop) and, through
the engine's Recorder, seconds per step region and per op call (shape, dtype). `stop` returns the
raw figures under "raw"; the profiler package turns them into shares, buckets and roofline figures.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.loop import EngineLoop


class StepProfiler:
    def __init__(self, loop: "EngineLoop"):
        self.loop = loop
        self._steps: list[tuple[float, int]] | None = None
        self._started = 0.0

    def _record(self, seconds: float, tokens: int) -> None:
        if self._steps is not None:
            self._steps.append((seconds, tokens))

    def start(self) -> dict[str, Any]:
        if self._steps is not None:
            return {"status": "already running"}
        self._steps, self._started = [], time.perf_counter()
        self.loop.step_hooks.append(self._record)
        self.loop.engine.start_recording()
        return {"status": "started"}

    def stop(self) -> dict[str, Any]:
        if self._steps is None:
            return {"status": "not running"}
        self.loop.step_hooks.remove(self._record)
        raw = self.loop.engine.stop_recording()
        steps, self._steps = self._steps, None
        wall = time.perf_counter() - self._started
        busy = sum(s for s, _ in steps)
        tokens = sum(n for _, n in steps)
        ordered = sorted(s for s, _ in steps)
        return {
            "status": "stopped", "wall_seconds": wall, "steps": len(steps), "busy_seconds": busy,
            "output_tokens": tokens, "tokens_per_second": tokens / wall if wall > 0 else 0.0,
            "step_ms_median": 1e3 * ordered[len(ordered) // 2] if ordered else None,
            "step_ms_max": 1e3 * ordered[-1] if ordered else None,
            "raw": raw,
        }
