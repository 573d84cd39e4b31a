"""Profiling an Engine in this process: drive a workload through it with the recorder on."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from kernelloop.common.progress import Progress, Step
from kernelloop.engine.engine import Engine
from kernelloop.engine.recorder import OP_TIMINGS
from kernelloop.engine.sampling import SamplingParams
from kernelloop.kernels.roofline import device_rates
from kernelloop.profiler.profile import assemble
from kernelloop.profiler.workload import WorkloadRequest, summarize_latencies


def profile_engine(engine: Engine, workload: list[WorkloadRequest], *, concurrency: int = 8,
                   seconds: float | None = None, trace_path: Path | None = None, op_timing: str = "auto",
                   progress: Progress = lambda message: None) -> dict[str, Any]:
    """Run `workload` (at most `concurrency` requests at once, at most `seconds`) and profile it.

    With `trace_path`, a torch.profiler Chrome trace (every op and step region labelled
    `kernelloop::<name>`) is written there; it opens in Perfetto (ui.perfetto.dev) or chrome://tracing.

    `op_timing` (engine/recorder.py): "auto" gives op rows device times on CUDA (each observed op
    and shape replayed after the run with the variant that served it) and perf_counter times on
    CPU; "replay" replays on CPU too (the rehearsal of the GPU path); "in-run" keeps the in-run
    brackets. Each row's `timing` says which source its seconds come from.
    """
    if op_timing not in OP_TIMINGS:
        raise ValueError(f"op_timing must be one of {', '.join(OP_TIMINGS)}, not {op_timing!r}")
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template(w.messages), add_special_tokens=False) for w in workload]
    pending = list(range(len(workload)))
    active: dict[str, int] = {}
    submitted: dict[str, float] = {}
    first: dict[str, float] = {}
    ttft: list[float] = []
    tpot: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds if seconds else float("inf")
    window_ends = time.monotonic() + seconds if seconds else None  # the same, on the clock Steps use
    torch_trace = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
        + ([torch.profiler.ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])) if trace_path else nullcontext()
    engine.start_recording(trace=trace_path is not None)
    engine.recorder.attach(engine.kernels, op_timing)
    start = time.perf_counter()
    try:
        with torch_trace:
            while pending or active:
                now = time.perf_counter()
                if now > deadline:
                    for rid in list(active):
                        engine.abort(rid)
                    break
                while pending and len(active) < concurrency:
                    i = pending.pop(0)
                    req = engine.add_request(prompts[i], SamplingParams(max_tokens=workload[i].max_tokens,
                                                                        temperature=0.0, ignore_eos=True))
                    active[req.rid], submitted[req.rid] = i, time.perf_counter()
                for out in engine.step():
                    now = time.perf_counter()
                    if out.rid in active and out.token_ids and out.rid not in first:
                        first[out.rid] = now
                        ttft.append(now - submitted[out.rid])
                    if out.finished and out.rid in active:
                        n = workload[active.pop(out.rid)].max_tokens
                        if n > 1 and out.rid in first:
                            tpot.append((now - first[out.rid]) / (n - 1))
                        done += 1
                        progress(Step(f"{done}/{len(workload)} requests done", "profile requests", done,
                                      len(workload), window_ends))
        while engine.has_work():  # aborted requests leave through the next step
            engine.step()
    finally:
        raw = engine.stop_recording()
    wall = time.perf_counter() - start
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        torch_trace.export_chrome_trace(str(trace_path))
    return assemble(raw, fingerprint=engine.kernels.fingerprint, engine="in-process", model=str(engine.model_dir),
                    kernels=engine.kernels.mode, wall_seconds=wall, requests=done,
                    latencies=summarize_latencies(ttft, tpot), rates=lambda dtype: device_rates(engine.config.device, dtype))
