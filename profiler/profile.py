"""The profile: one dict (JSON-ready) that `agent profile` prints, history stores and the agent reads.

Its keys are typed once, in kernelloop/common/profile_contract.py (`Profile`, `ProfileRow`, `ShapeSeen`, one
comment per field), re-exported here; `assemble()` builds it from a Recorder's raw figures
(profiler/analysis.py makes the rows).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, cast

from kernelloop.common.profile_contract import Profile, ProfileRow, ShapeSeen
from kernelloop.kernels.device import CPU_INTERPRETER
from kernelloop.profiler.analysis import RatesFor, profile_rows, region_timing

__all__ = ["Profile", "ProfileRow", "ShapeSeen", "assemble"]


def assemble(raw: dict[str, Any], *, fingerprint: str, engine: str, model: str, kernels: str, wall_seconds: float,
             requests: int, latencies: Mapping[str, float | None], rates: RatesFor | None, partial_reason: str = "",
             notes: list[str] | None = None, auto_stopped: bool = False, cancelled_requests: int = 0) -> Profile:
    """The profile of one run: `raw` is the engine's `stop_recording()` ({} when nothing was recorded),
    `latencies` profiler/workload.py `summarize_latencies()`'s medians."""
    counters = raw.get("counters", {})
    regions = raw.get("regions", {})
    output_tokens = counters.get("generated_tokens", 0)
    prompt = counters.get("prompt_tokens", 0)
    return {
        "created_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "device": fingerprint, "engine": engine, "model": model, "kernels": kernels,
        "timing_label": CPU_INTERPRETER if fingerprint == CPU_INTERPRETER else "cuda",
        "op_timing": (raw.get("op_timing") or region_timing(raw)) if raw else None,
        "region_timing": region_timing(raw) if raw else None,
        "replay_errors": list(raw.get("replay_errors") or []),
        "partial": bool(partial_reason), "partial_reason": partial_reason,
        "wall_seconds": wall_seconds,
        "busy_seconds": regions.get("step", {}).get("seconds", 0.0),
        "steps": regions.get("step", {}).get("calls", 0),
        "requests": requests, "output_tokens": output_tokens,
        "tokens_per_second": output_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        "ttft_ms_median": latencies.get("ttft_ms_median"), "tpot_ms_median": latencies.get("tpot_ms_median"),
        "prefix_hit_rate": counters.get("cached_prompt_tokens", 0) / prompt if prompt else None,
        "notes": list(notes or []), "auto_stopped": auto_stopped, "cancelled_requests": cancelled_requests,
        "rows": cast("list[ProfileRow]", profile_rows(raw, rates) if raw else []),
    }
