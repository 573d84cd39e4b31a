"""Interleaved A/B timing of the baseline and the candidate, inside the candidate's process.

The clocks are bound here, when the worker imports this module, before the candidate's module is
imported, so patching `time.perf_counter` or `torch.cuda.Event` later changes nothing. Each round
makes fresh inputs, alternates which side goes first, and returns every per-call time; the last
candidate output of each round goes back to the judge, which checks it against the reference.

CPU: a perf_counter per call. CUDA: per call an L2 flush outside the timed region, CUDA events
around the call on the current stream, and a device-wide synchronize: each side's time per call is
the larger of the event median and the synchronized wall time per call, so work moved to a side
stream is still counted. Calls under 20 us are timed as CUDA-graph replays (graph capture refuses
unjoined side streams).
"""

from __future__ import annotations

import time
from statistics import median as _median
from typing import Any, Callable

import torch

_clock = time.perf_counter
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_CUDAGraph = torch.cuda.CUDAGraph
_graph = torch.cuda.graph
L2_FLUSH_BYTES = 256 << 20
GRAPH_BELOW_S = 20e-6
CPU_SIDE_BUDGET_S = 0.1  # CPU: timed calls per side per round fill about this much



def _time_cpu(fn: Callable[[], Any], calls: int) -> tuple[list[float], Any]:
    samples, out = [], None
    for _ in range(calls):
        t0 = _clock()
        out = fn()
        samples.append(_clock() - t0)
    return samples, out


class _CudaTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def eager(self, fn: Callable[[], Any], calls: int) -> tuple[list[float], Any]:
        starts = [_Event(enable_timing=True) for _ in range(calls)]
        ends = [_Event(enable_timing=True) for _ in range(calls)]
        out = None
        _synchronize()
        for s, e in zip(starts, ends):
            self.flush.zero_()
            s.record()
            out = fn()
            e.record()
        _synchronize()  # device-wide: every stream
        event = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
        t0 = _clock()
        for _ in range(calls):
            fn()
        _synchronize()
        wall = (_clock() - t0) / calls
        return [max(x, wall) for x in event], out

    def graphed(self, fn: Callable[[], Any], calls: int) -> tuple[list[float], Any] | None:
        try:
            graph = _CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # warm up on the capture stream
            torch.cuda.current_stream().wait_stream(side)
            with _graph(graph):
                out = fn()
        except Exception:  # capture refused (e.g. work on an unjoined stream): time eagerly
            return None
        samples = []
        for _ in range(calls):
            self.flush.zero_()
            s, e = _Event(enable_timing=True), _Event(enable_timing=True)
            s.record()
            graph.replay()
            e.record()
            _synchronize()
            samples.append(s.elapsed_time(e) / 1e3)
        return samples, out


def run_rounds(
    baseline: Callable[..., Any],
    candidate: Callable[..., Any],
    make_args: Callable[[int], tuple],
    seeds: list[int],
    device: str,
    calls: int,
    on_round: Callable[[int], None] = lambda i: None,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Per round: {"baseline": [s...], "candidate": [s...], "mode": ...}; plus the candidate's last outputs.

    `calls` is the number of timed calls per side per round (on CPU at most: fewer when one call
    of the first side's warm-up already takes a good part of CPU_SIDE_BUDGET_S)."""
    rounds, outputs = [], []
    cuda = torch.device(device).type == "cuda"
    timer = _CudaTimer(torch.device(device)) if cuda else None
    use_graph = False
    if timer is not None:  # small kernels: launch overhead would hide the kernel, so both sides use graphs
        probe_args = make_args(seeds[0])
        baseline(*probe_args)
        use_graph = _median(timer.eager(lambda: baseline(*probe_args), 5)[0]) < GRAPH_BELOW_S
    for i, seed in enumerate(seeds):
        on_round(i)
        args = make_args(seed)
        sides = {"baseline": lambda: baseline(*args), "candidate": lambda: candidate(*args)}
        order = ["baseline", "candidate"] if i % 2 == 0 else ["candidate", "baseline"]
        record: dict[str, Any] = {"seed": seed}
        for side in order:
            fn = sides[side]
            t0 = _clock()
            fn()  # warm: compile / first-call costs stay out of the timed calls
            if timer is None and i == 0 and side == order[0]:
                # CPU: slow (interpreted) calls get fewer timed calls per round, never fewer than one
                calls = max(1, min(calls, int(CPU_SIDE_BUDGET_S / max(_clock() - t0, 1e-9))))
            mode = "perf_counter"
            if timer is None:
                samples, out = _time_cpu(fn, calls)
            else:
                graphed = timer.graphed(fn, calls) if use_graph else None
                if graphed is not None:
                    (samples, out), mode = graphed, "cuda-graph"
                else:
                    (samples, out), mode = timer.eager(fn, calls), "cuda-events+sync"
            record[side] = samples
            record[f"{side}_mode"] = mode
            if side == "candidate":
                outputs.append(out)
        rounds.append(record)
    return rounds, outputs
