"""The profile: one dict (JSON-ready) that `agent profile` prints, history stores and the agent reads.

    device, engine, model, kernels, partial, partial_reason, wall_seconds, busy_seconds, steps,
    requests, output_tokens, tokens_per_second, ttft_ms_median, tpot_ms_median, prefix_hit_rate,
    timing_label, op_timing, region_timing, replay_errors, rows: [{name, kind, calls, total_s,
    mean_us, share, timing, in_run_s (op rows), variant, bytes_per_s, roofline_pct, bound,
    shapes: [{dtype, bucket, shape, calls, seconds}]}],
    notes (what the driver waited for, extended or cancelled), auto_stopped (the engine ended the
    recording at its time limit), cancelled_requests (in flight when the window ended)

op_timing / region_timing / each row's timing: where the seconds come from (engine/recorder.py):
cpu-wall, cuda-events (in-run brackets), cuda-kernel-replay (device time), cpu-wall-replay.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kernelloop.kernels.device import CPU_INTERPRETER
from kernelloop.profiler.analysis import RatesFor, profile_rows, region_timing


def assemble(raw: dict[str, Any], *, device: str, engine: str, model: str, kernels: str, wall_seconds: float,
             requests: int, latencies: dict[str, Any], rates: RatesFor | None, partial_reason: str = "",
             notes: list[str] | None = None, auto_stopped: bool = False, cancelled_requests: int = 0) -> dict[str, Any]:
    counters = raw.get("counters", {})
    regions = raw.get("regions", {})
    output_tokens = counters.get("generated_tokens", 0)
    prompt = counters.get("prompt_tokens", 0)
    return {
        "created_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "device": device, "engine": engine, "model": model, "kernels": kernels,
        "timing_label": CPU_INTERPRETER if device == CPU_INTERPRETER else "cuda",
        "op_timing": (raw.get("op_timing") or region_timing(raw)) if raw else None,
        "region_timing": region_timing(raw) if raw else None,
        "replay_errors": list(raw.get("replay_errors") or []),
        "partial": bool(partial_reason), "partial_reason": partial_reason,
        "wall_seconds": wall_seconds,
        "busy_seconds": regions.get("step", {}).get("seconds", 0.0),
        "steps": regions.get("step", {}).get("calls", 0),
        "requests": requests, "output_tokens": output_tokens,
        "tokens_per_second": output_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        **latencies,
        "prefix_hit_rate": counters.get("cached_prompt_tokens", 0) / prompt if prompt else None,
        "notes": list(notes or []), "auto_stopped": auto_stopped, "cancelled_requests": cancelled_requests,
        "rows": profile_rows(raw, rates) if raw else [],
    }
