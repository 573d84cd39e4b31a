"""The sandboxed processes: a *runner* calls one module's `forward`, a *replayer* redoes records.

Both start as children of the fork server (or a fresh interpreter), confine themselves before any
untrusted code exists in them (sandbox/inside/confine.py: namespaces, Landlock, seccomp; then rlimits, an
allowlisted environment, a scratch cwd/HOME/TMPDIR, an audit hook as a second layer), then serve the
judge one message at a time over their channel (sandbox/wire.py; the messages: sandbox/messages.py).
Neither decides anything: the runner sends back what `forward` returned plus the record of how
(sandbox/inside/trace.py); the replayer sends back what the record computes (sandbox/inside/replay.py). They never
see seeds, expected outputs, the plan, clocks the judge reads, or the other side's code.

Runner, per "call": inputs in -> outputs, the inputs as they are afterwards, the record, facts; per
"capture" (--compile-for): its launches at given shapes, described on meta inputs (sandbox/inside/capture.py).
Replayer, per call: "stage" (record + inputs), then "go": replay, answered by "done" with the outputs
and the inputs afterwards (on CUDA with the event time measured here, since no candidate Python runs
in this process on a GPU).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from kernelloop.kernels import interpreter_autotune
from kernelloop.kernels.device import Device
from kernelloop.kernels.display import safe_text
from kernelloop.kernels.ops import get_op  # (the op specs, imported in the fork server before any fork)
from kernelloop.kernels.spec import parse_dtype
from kernelloop.kernels.timing import l2_flusher
from kernelloop.sandbox import wire
from kernelloop.sandbox.inside import capture, guards, trace
from kernelloop.sandbox.inside.compile_child import serve_compiles
from kernelloop.sandbox.inside.replay import Replay, ReplayError, kernels_from_module, kernels_from_source
from kernelloop.sandbox.lifetime import die_with_parent, ignore_interrupts
from kernelloop.sandbox.messages import Done, Error, Facts, Job, Load, Ready, Record, Result, Staged, conform, parse


def _prewarm() -> None:
    """One-time costs paid in the fork server, not in every child: entering a TorchDispatchMode the
    first time imports ~800 modules (about 1 s). Allocation only: no OpenMP pool is started."""
    with trace.Recorder():
        torch.empty(1)


_prewarm()


def one_line(exc: BaseException) -> str:
    """The exception as one display-safe line, its type first: a message's line breaks, carriage returns
    and escape sequences are shown as escapes (kernels/display.py), never allowed to hide the type."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, SyntaxError):  # file, line and caret first: its last line is "SyntaxError: msg"
        text = text.splitlines()[-1] if text else ""
    return safe_text(text or type(exc).__name__)[:500]


def load_module(source: str, filename: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Load a candidate as the engine does (kernels/candidate/loader.py: canonical text, module
    `kernelloop_kernel`, guarded builtins, frozen state; the judge ran the static check, or was told not
    to): its purity-checked forward and its plain constants (for the replayer). `filename` is unused:
    the module's file name is its canonical text's label, the same in the engine."""
    import triton.language as tl

    from kernelloop.kernels.candidate.loader import load_kernel

    loaded = load_kernel(source, static=False, thorough=True)
    constants: dict[str, Any] = {}
    for name, value in list(loaded.namespace.items()):
        if name.startswith("__") or not isinstance(name, str):
            continue
        if isinstance(value, tl.constexpr):
            value = value.value
            if value is None or isinstance(value, (bool, int, float)):
                constants[name] = {"constexpr": value}
        elif value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) < 256):
            constants[name] = value
    return loaded.forward, constants


def _setup(job: Job) -> dict[str, str]:
    """Confine this (single-threaded, just forked) process; returns facts for the verdict."""
    if job.get("own_session", True):
        os.setsid()
    scratch = Path(job["scratch"])
    facts = {"process_group": "own session" if job.get("own_session", True) else "the launcher's session"}
    if job.get("confine", True):
        from kernelloop.sandbox.inside.confine import Policy, confine

        facts.update(confine(Policy(scratch=scratch, allow_exec=tuple(job.get("allow_exec", ())))))
    else:
        facts["confinement"] = "none (--unconfined)"
    facts.update(guards.isolate(scratch, job["memory_mb"], job["cpu_seconds"], Device.of(job["device"])))
    tempfile.tempdir = str(scratch)
    torch.set_num_threads(1)
    return facts


def _no_more_threads(job: Job) -> None:
    """On CPU nothing legitimate starts a thread or a process after warm-up: the kernel refuses them.
    (On CUDA Triton still compiles, i.e. spawns ptxas and the C compiler, on a kernel's first launch.)"""
    if Device.of(job["device"]).interpreted and job.get("confine", True):
        from kernelloop.sandbox.inside.confine import forbid_new_threads

        forbid_new_threads()


def _to_device(t: torch.Tensor, device: Device) -> torch.Tensor:
    if device.kind == "cpu":
        return t
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    moved = raw.to(device.torch)
    return torch.empty(0, dtype=t.dtype, device=device.torch).set_(moved.untyped_storage(), t.storage_offset(),
                                                              t.shape, t.stride())


def _decode_args(header: dict[str, Any], tensors: list[torch.Tensor], device: Device) -> tuple:
    args = []
    for a in header["args"]:
        if isinstance(a, dict) and isinstance(a.get("tensor"), int) and 0 <= a["tensor"] < len(tensors):
            args.append(_to_device(tensors[a["tensor"]], device))
        elif a is None or isinstance(a, (bool, int, float)):
            args.append(a)
        else:
            raise wire.ProtocolError("malformed call arguments")
    return tuple(args)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _call(forward: Callable[..., Any], args: tuple, state: dict[str, Any], device: Device) -> tuple[Any, Facts, Record]:
    recorder = trace.Recorder()
    recorder.begin(args)
    facts = Facts(error=None, memory=False, launches=0, torch_ops=[], violations=[], count=0, types=[], devices=[])
    threads, violations = _threads(), len(guards.VIOLATIONS)
    state["recorder"], state["launches"] = recorder, 0
    try:
        with recorder:
            out = forward(*args)
        device.synchronize()
    except BaseException as exc:  # SystemExit / KeyboardInterrupt from a candidate is its failure too
        facts["error"] = one_line(exc)
        facts["memory"] = guards.out_of_memory(exc)  # refused by the memory limit, whatever the message says
        out = None
    finally:
        state["recorder"] = None
    if recorder.memory_refused and not facts["memory"]:  # refused, then caught by the candidate
        facts["error"] = facts["error"] or "an allocation was refused by the memory limit (the candidate caught it)"
        facts["memory"], out = True, None
    record = recorder.finish(out) if out is not None else Record(entries=[], outputs=[], inputs=len(args), problem=None)
    facts["launches"] = state["launches"]
    facts["torch_ops"] = sorted(set(recorder.forbidden))[:10]
    facts["violations"] = guards.VIOLATIONS[violations:][:5]
    if _threads() > threads:
        facts["violations"].append(f"started {_threads() - threads} thread(s)")
    return out, facts, record


def serve_calls(chan: wire.Channel, job: Job) -> None:
    """The runner: load the module (or the op's trusted baseline), then answer "call" messages."""
    device, spec = Device.of(job["device"]), get_op(job["op"])
    state: dict[str, Any] = {"recorder": None}
    trace.install_launch_hook(state)
    # Warm the interpreter and the dispatch path with the op's own kernel before any candidate code.
    _call(spec.forward, spec.make_inputs(spec.test_shapes[0], parse_dtype("float32"), 0, device.torch), state, device)
    _no_more_threads(job)
    if not device.interpreted:  # now that the CUDA context holds its own memory (the limit is set before any candidate)
        guards.limit_memory(job["memory_mb"], address_space=False)
    guards.install_audit_hook(Path(job["scratch"]), frozenset(job.get("allow_exec", ())))
    if job.get("source") is None:
        forward, constants = spec.forward, {}
    else:
        try:
            forward, constants = load_module(job["source"], job["filename"])
        except BaseException as exc:
            chan.send(Load(type="load", ok=False, error=one_line(exc), constants={}, violations=guards.VIOLATIONS[:5]))
            return
    chan.send(Load(type="load", ok=True, error=None, constants=constants, violations=guards.VIOLATIONS[:5]))
    with torch.inference_mode():  # as the engine calls kernels (engine/model.py): inputs are inference tensors
        _answer_calls(chan, forward, spec, state, device)


def _answer_calls(chan: wire.Channel, forward: Callable[..., Any], spec: Any, state: dict[str, Any], device: Device) -> None:
    while True:
        header, tensors = chan.receive()
        header = parse(header, "call", "capture")
        if header["type"] == "capture":  # --compile-for: describe the launches at shapes it is not run at
            chan.send(capture.answer(forward, spec, header))
            continue
        args = _decode_args(header, tensors, device)
        interpreter_autotune.pin(header.get("config"))  # this call's autotune config slot (None: the device's choice)
        out, facts, record = _call(forward, args, state, device)
        outs = out if isinstance(out, tuple) else (out,)
        sent: list[torch.Tensor] = []
        if out is not None:
            facts["count"] = len(outs)
            facts["types"] = [type(o).__name__ for o in outs]
            if all(type(o) is torch.Tensor and o.dtype in wire.WIRE_NAMES for o in outs):
                sent = list(outs)
                facts["devices"] = [o.device.type for o in outs]
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        chan.send(Result(type="result", facts=facts, record=record, outputs=len(sent)), sent + inputs)


class _CudaTimer:
    """Event time of one replay, after an L2 flush outside the timed region."""

    def __init__(self) -> None:
        self.flush = l2_flusher(torch.device("cuda"), "read")  # leaves L2 clean: nothing to write back

    def time(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush()
        torch.cuda.synchronize()
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(end) / 1e3


def serve_replays(chan: wire.Channel, job: Job) -> None:
    """The replayer: rebuild the kernels (from the judge's copy of the source), then stage and go."""
    device = Device.of(job["device"])
    _no_more_threads(job)
    guards.install_audit_hook(Path(job["scratch"]), frozenset(job.get("allow_exec", ())))
    try:
        table = (kernels_from_module(get_op(job["op"]).forward.__module__) if job.get("source") is None
                 else kernels_from_source(job["source"], job.get("constants", {})))
    except ReplayError as exc:
        chan.send(Load(type="load", ok=False, error=str(exc), constants={}, violations=guards.VIOLATIONS[:5]))
        return
    chan.send(Load(type="load", ok=True, error=None, constants={}, violations=guards.VIOLATIONS[:5]))
    replay, timer = Replay(table, device), (_CudaTimer() if device.timer == "cuda-events" else None)
    record, inputs, outputs = None, [], []
    while True:
        header, tensors = chan.receive()
        header = parse(header, "stage", "go")
        if header["type"] == "stage":
            record, inputs, outputs = header["record"], [_to_device(t, device) for t in tensors], []
            chan.send(Staged(type="staged"))
        else:  # the outputs travel with "done": the judge's clock stops when they have arrived
            violations = len(guards.VIOLATIONS)
            try:
                order = header.get("order")
                if timer is None:
                    outputs, elapsed = replay.run(record, inputs, order), None
                else:
                    outputs, elapsed = timer.time(lambda: replay.run(record, inputs, order))  # noqa: B023
                replay.check_guards()  # outside the timed region: stores past an allocation (no address checks on CUDA)
                done = Done(type="done", elapsed_s=elapsed, error=None, outputs=len(outputs), violations=[])
            except BaseException as exc:  # noqa: BLE001 (a kernel that raises is the candidate's failure)
                outputs, done = [], Done(type="done", elapsed_s=None, error=one_line(exc), outputs=0, violations=[])
            done["violations"] = guards.VIOLATIONS[violations:][:5]
            chan.send(done, list(outputs) + list(inputs))


def child_main(chan_fd: int, log_fd: int, job: Job) -> None:
    """Entry point of a sandboxed process; never returns."""
    chan = wire.Channel(chan_fd)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        conform(job, Job, "the job")
        chan.send(Ready(type="ready", isolation=_setup(job)))
        if job["role"] == "compile":  # --compile-for: compiled Triton, no candidate Python ran here
            serve_compiles(chan, job)
        else:
            (serve_calls if job["role"] == "run" else serve_replays)(chan, job)
    except BaseException as exc:  # harness-side failure (e.g. the candidate broke torch): report, then die
        try:
            chan.send(Error(type="error", error=one_line(exc), violations=guards.VIOLATIONS[:5]))
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)


def run_fresh(chan_fd: int, log_fd: int, judge: int) -> None:
    """Fresh-interpreter mode (no fork server): the job arrives on stdin. Confinement needs a
    single-threaded process and torch has started threads by now, so this process leads a new
    session and forks the sandboxed process into it, then waits (its death kills the child, as the
    judge's kills it)."""
    die_with_parent(judge)
    ignore_interrupts()
    job = json.loads(sys.stdin.read())
    if os.getsid(0) != os.getpid():
        os.setsid()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent(parent)
        child_main(chan_fd, log_fd, {**job, "own_session": False})
    os.close(chan_fd)
    os.close(log_fd)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)

