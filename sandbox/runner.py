"""Running candidates: one isolated process each, from a pre-warmed fork server, and their verdicts.

The fork server (sandbox/forkserver.py: torch, triton and the op library preloaded, no CUDA or
OpenMP initialised, an allowlisted environment) forks a fresh process per candidate, which costs
milliseconds instead of the seconds a new interpreter needs. The judge (this process) enforces
the wall-clock limit and the memory limit, kills the candidate's whole session when the verdict
is reached, and reads only framed data from it (sandbox/wire.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from kernels.device import device_fingerprint
from kernels.ops import get_op
from kernels.registry.entry import sha256_text
from kernels.registry.store import Registry
from sandbox import judge as judging
from sandbox import wire
from sandbox.forkserver import ForkServer, start_fresh
from sandbox.options import CheckOptions
from sandbox.plan import make_plan, master_seed
from sandbox.roofline import copy_bandwidth
from sandbox.static_check import static_check
from sandbox.verdict import Verdict

# Triton compiles kernels and its launcher with these on CUDA; nothing else may be started.
CUDA_EXECUTABLES = frozenset({"ptxas", "cc", "gcc", "clang", "x86_64-linux-gnu-gcc", "ldconfig", "ldconfig.real",
                              "cuobjdump", "nvdisasm"})
LOG_TAIL_CHARS = 2000
_BASE_RSS = 1 << 30  # the pre-warmed process's own footprint (torch + triton), not charged to the candidate
Progress = Callable[[str], None]


def _session_members(sid: int) -> list[int]:
    """Pids whose session is `sid` (the candidate called setsid, so its session id is its pid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # fields after the command: state ppid pgrp session ...
                pids.append(int(entry))
    return pids


def _rss_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _kill_session(pid: int) -> None:
    for target in [pid, *_session_members(pid)]:
        try:
            os.killpg(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Sandbox:
    """Judges candidates for one device with one set of options; reuse it for a batch."""

    def __init__(self, options: CheckOptions, progress: Progress | None = None) -> None:
        self.options = options
        self.progress = progress or (lambda message: None)
        self.fingerprint = device_fingerprint(options.device)
        self.seed = master_seed(options)
        self.server = ForkServer() if options.fork_server else None
        self._bandwidth: float | None = None

    @property
    def bandwidth(self) -> float:
        if self._bandwidth is None:
            self._bandwidth = copy_bandwidth(self.options.device)
        return self._bandwidth

    def judge_source(self, op: str, source: str, filename: str) -> Verdict:
        spec = get_op(op)
        start = time.monotonic()
        v = Verdict(op=op, device=self.fingerprint, file=filename, sha256=sha256_text(source))
        if self.options.static_check:
            result = static_check(source, spec.arg_names)
            if not result.ok:
                v.fail("static", result.reason)
                v.duration_s = round(time.monotonic() - start, 3)
                return v
        v.stage = "load"
        plan = make_plan(spec, self.options, self.seed ^ int(v.sha256[:15], 16))
        job = self._job(spec, source, filename, plan, v)
        scratch = Path(tempfile.mkdtemp(prefix="kernelloop-sandbox-"))
        try:
            self._run(spec, {**job, "scratch": str(scratch)}, plan, v)
            log = scratch / "candidate.log"
            if log.exists():
                v.log_tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if v.failure is None and not self.options.timing:
            v.reason = "correct (timing skipped)"
        v.duration_s = round(time.monotonic() - start, 3)
        return v

    def _job(self, spec: Any, source: str, filename: str, plan: dict, v: Verdict) -> dict[str, Any]:
        baseline: dict[str, Any] = {"source": None, "sha256": None, "label": "baseline"}
        timing = plan["timing"]
        registry = Registry(self.options.registry)
        if timing and registry.exists():
            entry = registry.select(spec.name, self.fingerprint, timing["dtype"], spec.bucket(timing["shape"]))
            if entry is not None:
                baseline = {"source": registry.source(entry), "sha256": entry.sha256, "label": entry.id}
        v.baseline = f"registry {baseline['label']}" if baseline["source"] else "the op's baseline kernel"
        return {
            "op": spec.name, "device": self.options.device, "source": source, "filename": filename,
            "baseline": baseline, "trials": plan["trials"], "timing": timing,
            "memory_mb": self.options.memory_mb, "cpu_seconds": int(self.options.timeout_s * 2) + 5,
            "allowed_executables": sorted(CUDA_EXECUTABLES) if self.options.device == "cuda" else [],
        }

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, spec: Any, job: dict[str, Any], plan: dict, v: Verdict) -> None:
        child = self.server.start(job) if self.server is not None else start_fresh(job)
        receiver, status = child.conn, None
        deadline = time.monotonic() + self.options.timeout_s
        trials = {t["id"]: t for t in plan["trials"]}
        phase, done = "starting", False
        try:
            while v.failure is None and not done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    v.fail("timeout", f"no verdict within {self.options.timeout_s:g} s (during {phase})")
                    break
                if not receiver.poll(min(remaining, 0.25)):
                    members = _session_members(child.pid) or [child.pid]
                    if _rss_bytes(members) > (self.options.memory_mb << 20) + _BASE_RSS:
                        v.fail("memory", f"memory limit of {self.options.memory_mb} MiB exceeded (during {phase})")
                    continue
                try:
                    header, tensors = wire.receive(receiver)
                except (EOFError, OSError):
                    code = status = child.exit_status(timeout=2.0)  # None: it closed the pipe but lives on
                    how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                           else f"exit status {code}" if code is not None else "it closed its channel")
                    v.fail("crash", f"the candidate's process died during {phase} ({how})")
                    break
                except wire.ProtocolError as exc:
                    v.fail("crash", f"the candidate's process sent garbage during {phase}: {exc}")
                    break
                phase, done = self._handle(spec, header, tensors, trials, plan, v, phase)
        finally:
            _kill_session(child.pid)
            if status is None:
                child.exit_status(timeout=30.0)  # reap it (and keep the fork server's replies in step)
            receiver.close()

    def _handle(self, spec: Any, header: dict, tensors: list, trials: dict, plan: dict, v: Verdict,
                phase: str) -> tuple[str, bool]:
        kind = header.get("type")
        if kind == "phase":
            self.progress(str(header.get("text", "")))
            return str(header.get("text", phase)), False
        if kind == "isolation":
            v.isolation = {k: str(val) for k, val in header.items() if k not in ("type", "tensors")}
        elif kind == "load":
            if header.get("violations"):
                v.fail("sandbox-violation", f"while importing: {header['violations'][0]}")
            elif not header.get("ok"):
                v.fail("load", f"importing the candidate failed: {header.get('error', '')}")
            else:
                v.stage = "correctness"
        elif kind == "trial":
            trial = trials.get(header.get("id"))
            if trial is None:
                v.fail("crash", "the candidate's process reported an unknown trial")
            else:
                judging.judge_trial(v, spec, trial, header, tensors, self.options.device)
                if v.failure is None and trial["id"] == len(trials) - 1:
                    v.correct = True
                    v.stage = "timing" if plan["timing"] else "done"
        elif kind == "timing":
            if not v.correct:
                v.fail("crash", "timing arrived before every trial passed")
            else:
                judging.judge_timing(v, spec, plan["timing"], header, tensors, self.options.min_gain, self.bandwidth)
                v.stage = "done"
        elif kind == "error":
            v.fail("sandbox-violation" if header.get("violations") else "crash",
                   f"during {phase}: {(header.get('violations') or [header.get('error', '')])[0]}")
        elif kind == "done":
            if header.get("violations") and v.failure is None:
                v.fail("sandbox-violation", header["violations"][0])
            if not v.correct and v.failure is None:
                v.fail("crash", "the candidate's process finished without running every trial")
            return phase, True
        return phase, False


def judge_files(op: str, paths: list[Path], options: CheckOptions, progress: Progress | None = None) -> list[Verdict]:
    """One verdict per file, in order, from one sandbox (one fork server)."""
    verdicts = []
    with Sandbox(options, progress) as sandbox:
        for path in paths:
            path = Path(path)
            verdicts.append(sandbox.judge_source(op, path.read_text(errors="replace"), str(path)))
    return verdicts
