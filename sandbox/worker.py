"""The candidate's process: isolate, load, run the trials the judge planned, send raw results.

Runs in a child of the fork server (or a fresh interpreter). It never decides a verdict: it sends
outputs and facts (launch counts, forbidden torch ops, aliasing, input changes, blocked attempts,
timings) over the channel in sandbox/wire.py, and the judge, in another process, compares them with
the reference. Harness code that the candidate could otherwise reach (clocks, the baseline, input
generation) is bound before the candidate's module is imported.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import traceback
import types
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

import torch

import kernels.ops  # noqa: F401  (the op specs, imported before any fork)
from kernels.compare import as_tuple
from kernels.registry.loader import load_forward
from kernels.spec import parse_dtype
from sandbox import ab_timing, guards, wire


def _prewarm() -> None:
    """Pay one-time costs here, in the fork server, not in every child: entering a TorchDispatchMode
    the first time imports ~800 modules (about 1 s). Allocation only: no OpenMP pool is started."""
    with guards.TorchGuard(poison=True):
        torch.empty(1)


_prewarm()


def load_candidate(source: str, filename: str) -> Callable[..., Any]:
    """Execute the candidate as a fresh module with guarded builtins; return its forward."""
    label = f"<candidate {Path(filename).name}>"
    linecache.cache[label] = (len(source), None, source.splitlines(keepends=True), label)
    module = types.ModuleType("kernelloop_candidate")
    module.__file__ = label
    module.__dict__["__builtins__"] = guards.candidate_builtins()
    exec(compile(source, label, "exec"), module.__dict__)
    forward = module.__dict__.get("forward")
    if not callable(forward):
        raise TypeError("the module defines no callable forward")
    return forward


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + max(s.nbytes(), 1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view of the raw bits, so comparisons are bitwise (NaN == NaN, -0 != +0)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(ints[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Runner:
    """Calls the candidate under the guards and collects the facts the judge needs."""

    def __init__(self, forward: Callable[..., Any], launches: guards.LaunchGuard, device: str) -> None:
        self.forward, self.launches, self.device = forward, launches, device

    def call(self, args: tuple, poison: bool, suppress: bool = False) -> tuple[Any, dict[str, Any]]:
        facts: dict[str, Any] = {}
        self.launches.launches, self.launches.suppress = 0, suppress
        guard = guards.TorchGuard(poison=poison)
        threads, violations = _threads(), len(guards.VIOLATIONS)
        try:
            with guard:
                out = self.forward(*args)
            if self.device == "cuda":
                torch.cuda.synchronize()
        except BaseException as exc:  # SystemExit / KeyboardInterrupt from a candidate is its failure too
            facts["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
            facts["memory"] = isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) \
                or "out of memory" in str(exc)
            out = None
        finally:
            self.launches.suppress = False
        facts["launches"] = self.launches.launches
        facts["torch_ops"] = sorted(set(guard.forbidden))[:10]
        facts["violations"] = guards.VIOLATIONS[violations:][:5]
        if _threads() > threads:
            facts["violations"].append(f"started {_threads() - threads} thread(s)")
        return out, facts


def _output_facts(out: Any, args: tuple, snapshot: list[Any]) -> dict[str, Any]:
    outs = as_tuple(out)
    facts: dict[str, Any] = {"count": len(outs)}
    bad = [f"output {i} is {type(o).__name__}, not a plain torch.Tensor"
           for i, o in enumerate(outs) if type(o) is not torch.Tensor]
    if bad:
        facts["bad_output"] = bad[0]
        return facts
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    for i, o in enumerate(outs):
        lo, hi = _storage_range(o)
        for j, a in enumerate(inputs):
            alo, ahi = _storage_range(a)
            if lo < ahi and alo < hi:
                facts["aliasing"] = f"output {i} shares memory with input {j}"
    for j, (a, before) in enumerate(zip(args, snapshot)):
        if isinstance(a, torch.Tensor) and not _same_bits(a, before):
            facts["input_mutated"] = f"input {j} changed"
            break
    return facts


def run_job(conn: Any, job: dict[str, Any]) -> None:
    scratch = Path(job["scratch"])
    facts = guards.isolate(scratch, job["memory_mb"], job["cpu_seconds"], job["device"])
    guards.redirect_output(scratch / "candidate.log")
    device = job["device"]
    torch.set_num_threads(1)
    spec = kernels.ops.get_op(job["op"])
    base = job["baseline"]
    baseline = spec.forward if base["source"] is None else load_forward(base["source"], base["sha256"], base["label"])
    make = lambda shape, dtype, seed: spec.make_inputs(shape, parse_dtype(dtype), seed, device)  # noqa: E731
    # Warm torch and the baseline before the guards: thread pools and lazy imports exist from here on.
    baseline(*make(job["trials"][0]["shape"], job["trials"][0]["dtype"], 0))
    guards.install_audit_hook(scratch, frozenset(job["allowed_executables"]))
    launches = guards.LaunchGuard()
    wire.send(conn, {"type": "isolation", **facts})

    try:
        forward = load_candidate(job["source"], job["filename"])
    except BaseException as exc:
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
        wire.send(conn, {"type": "load", "ok": False, "error": message, "violations": guards.VIOLATIONS[:5]})
        return
    wire.send(conn, {"type": "load", "ok": True, "violations": guards.VIOLATIONS[:5]})
    runner = Runner(forward, launches, device)

    for trial in job["trials"]:
        wire.send(conn, {"type": "phase", "text": f"trial {trial['id']}"})
        args = make(trial["shape"], trial["dtype"], trial["seed"])
        snapshot = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        out, call_facts = runner.call(args, poison=True, suppress=trial.get("suppress", False))
        result: dict[str, Any] = {"type": "trial", "id": trial["id"], **call_facts}
        tensors: list[torch.Tensor] = []
        if out is not None:
            result.update(_output_facts(out, args, snapshot))
            if "bad_output" not in result and "aliasing" not in result:
                tensors = [o for o in as_tuple(out)]
                if trial.get("determinism") and "error" not in result:
                    again, _ = runner.call(args, poison=True)
                    same = again is not None and len(as_tuple(again)) == len(tensors) and all(
                        type(b) is torch.Tensor and _same_bits(a, b) for a, b in zip(tensors, as_tuple(again)))
                    result["deterministic"] = same
        result["devices"] = [str(t.device.type) for t in tensors]
        wire.send(conn, result, tensors)

    timing = job.get("timing")
    if timing:
        def on_round(i: int) -> None:
            wire.send(conn, {"type": "phase", "text": f"timing round {i + 1}/{len(timing['seeds'])}"})

        rounds, outs = ab_timing.run_rounds(
            baseline, forward, lambda seed: make(timing["shape"], timing["dtype"], seed),
            timing["seeds"], device, timing["calls"], on_round)
        tensors = [o for out in outs for o in as_tuple(out)]
        if all(type(t) is torch.Tensor for t in tensors):
            wire.send(conn, {"type": "timing", "rounds": rounds, "violations": guards.VIOLATIONS[:5]}, tensors)
        else:
            wire.send(conn, {"type": "timing", "rounds": rounds, "bad_output": "a timed call returned a non-tensor"})
    wire.send(conn, {"type": "done", "violations": guards.VIOLATIONS[:5]})


def child_main(conn: Any, job: dict[str, Any]) -> None:
    """Entry point of the candidate's process (a multiprocessing target)."""
    try:
        run_job(conn, job)
    except BaseException as exc:  # harness-side failure (e.g. the candidate broke torch): report, then die
        try:
            message = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
            wire.send(conn, {"type": "error", "error": message, "violations": guards.VIOLATIONS[:5]})
        except BaseException:
            pass
    finally:
        conn.close()
        sys.stdout.flush()
        os._exit(0)


def run_fresh(fd: int) -> None:
    """Fresh-interpreter mode: the job on stdin, the result pipe on `fd`."""
    child_main(Connection(fd, readable=False), json.loads(sys.stdin.read()))
