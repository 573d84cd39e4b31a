"""The judge's handles on sandboxed processes: start one, talk to it under a deadline, kill it.

The conversation (sandbox/inside/worker.py has the other side; sandbox/messages.py declares every message): a
runner answers "call" with "result"; a replayer answers "stage" with "staged", then "go" with "done".
Every send and every read is bounded by the candidate's deadline; any message of the wrong kind, or
whose keys or value types are not exactly the declared ones (`messages.parse`), is a
wire.ProtocolError, and an "error" message from the child is `Refused`.

Each child gets a socketpair end as its channel and a log file the judge created and keeps open (so
the judge reads the candidate's stdout/stderr through its own descriptor: a child that replaces the
file by a FIFO, a directory or a symlink changes nothing the judge reads). A child's whole session is
SIGKILLed when it is closed; its resident memory is watched while the judge waits on it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from kernelloop.kernels.device import Device
from kernelloop.kernels.display import safe_text
from kernelloop.sandbox import wire
from kernelloop.sandbox.inside.guards import memory_refused
from kernelloop.sandbox.judge.forkserver import ForkServer, start_fresh
from kernelloop.sandbox.messages import Call, Done, Error, Facts, Go, Job, Record, Result, Stage, ToChild, parse

LOG_TAIL_BYTES = 2000
_BASE_RSS = 1 << 30  # the pre-warmed process's own footprint (torch + triton), not charged to the candidate


class MemoryExceeded(Exception):
    pass


class Refused(Exception):
    """A sandboxed process answered with an error instead of the expected message."""

    def __init__(self, failure: str, reason: str) -> None:
        super().__init__(reason)
        self.failure = failure


def refusal(header: Error) -> Refused:
    """The verdict an "error" message stands for (an allocation the memory limit refused is `memory`)."""
    if header["violations"]:
        return Refused("sandbox-violation", str(header["violations"][0])[:300])
    error = str(header["error"])
    if memory_refused(error):
        return Refused("memory", f"the sandboxed process ran out of its memory limit: {error[:300]}")
    return Refused("crash", f"the sandboxed process failed: {error[:300]}")


def _encode_args(args: tuple) -> tuple[list, list]:
    tensors, encoded = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            encoded.append({"tensor": len(tensors)})
            tensors.append(a)
        else:
            encoded.append(a)
    return encoded, tensors


def session_members(sid: int) -> list[int]:
    """Pids whose session is `sid` (every child calls setsid, so its session id is its pid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid:  # fields after the command: state ppid pgrp session ...
                pids.append(int(entry))
    return pids


def rss_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def thread_cpu_ns(pids: Iterable[int]) -> dict[tuple[int, int], int]:
    """Nanoseconds each thread of the processes has run so far, by (pid, tid): the scheduler's own count
    (/proc/<pid>/task/<tid>/schedstat), nothing the process says. Threads gone meanwhile are left out."""
    times = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                times[(pid, int(tid))] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return times


def kill_session(pid: int) -> None:
    for target in [pid, *session_members(pid)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def read_log_tail(fd: int, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of the log, read through the judge's own descriptor (never by path)."""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)).decode(errors="replace")
    except OSError:
        return ""


class Child:
    """One sandboxed process. Every send and receive is bounded by `deadline` (time.monotonic());
    receiving also enforces the memory limit. `busy_s` sums the seconds spent waiting on its answers."""

    def __init__(self, server: ForkServer | None, job: Job, scratch: Path, memory_mb: int,
                 deadline: float) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        self.log_fd = os.open(scratch.parent / f"{scratch.name}.log", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.memory_bytes = (memory_mb << 20) + _BASE_RSS
        self.deadline, self.busy_s = deadline, 0.0
        self.role: str = job.get("role", "")
        self.device = Device.of(job.get("device", "cpu"))
        job = Job(**{**job, "scratch": str(scratch)})
        try:
            if server is not None:
                self.pid, self._wait = server.start(job, theirs.fileno(), self.log_fd), server.wait
            else:
                self.pid, wait = start_fresh(job, theirs.fileno(), self.log_fd)
                self._wait = lambda pid, timeout: wait(timeout)
        finally:
            theirs.close()
        self._sock = ours  # kept so the fd stays open
        os.set_blocking(ours.fileno(), False)  # so a child that stops reading cannot block a send
        self.chan = wire.Channel(ours.fileno())
        self.status: int | None = None
        self.isolation: dict[str, str] = {}  # its "ready" message's, once received
        self.closed = False
        self._go_at = 0.0
        self.cpu_timed = False  # a CPU timing replayer: its replays' seconds are their CPU time
        self._cpu_at: dict[tuple[int, int], int] = {}
        self.last_config: int | None = None  # the config slot of the last call sent

    def _check_memory(self) -> None:
        if rss_bytes(session_members(self.pid) or [self.pid]) > self.memory_bytes:
            raise MemoryExceeded()

    def receive(self, max_bytes: int = wire.MAX_TENSOR_BYTES) -> tuple[dict, list]:
        try:
            return self.chan.receive(self.deadline, max_bytes, on_wait=self._check_memory)
        except wire.ChannelClosed as exc:
            exc.child = self  # which process died, for the verdict
            raise

    def send(self, header: ToChild, tensors: list = ()) -> None:
        try:
            self.chan.send(header, tensors, self.deadline)
        except wire.ChannelClosed as exc:
            exc.child = self
            raise

    def expect(self, kind: str, max_bytes: int = 1 << 20) -> dict[str, Any]:
        """The next message, which must be a `kind` exactly as declared (an "error" is `Refused`)."""
        header = parse(self.receive(max_bytes)[0], kind, "error")
        if header["type"] == "error":
            raise refusal(header)
        return header

    # -- a runner -------------------------------------------------------------------------------

    def send_call(self, args: tuple, config: int | None = None) -> None:
        """Start one `forward` call; `receive_result` collects it (the judge can work meanwhile). `config`
        pins the autotuned kernels' config slot for the call (None: the device's own choice)."""
        encoded, tensors = _encode_args(args)
        self._sent_at, self._n_inputs, self.last_config = time.monotonic(), len(tensors), config
        self.send(Call(type="call", args=encoded) if config is None else Call(type="call", args=encoded, config=config),
                  tensors)

    def receive_result(self, limit: int) -> tuple[list, Facts, Record, list]:
        """(outputs, facts, record, inputs afterwards). `limit`: bytes of tensors the answer may carry."""
        received, got = self.receive(limit)
        header: Result | Error = parse(received, "result", "error")
        if header["type"] == "error":
            raise refusal(header)
        n = header["outputs"]
        if not 0 <= n <= len(got) or len(got) - n != self._n_inputs:
            raise wire.ProtocolError("a result with the wrong number of tensors")
        self.busy_s += time.monotonic() - self._sent_at
        return got[:n], header["facts"], header["record"], got[n:]

    def call(self, args: tuple, limit: int, config: int | None = None) -> tuple[list, Facts, Record, list]:
        self.send_call(args, config)
        return self.receive_result(limit)

    # -- a replayer -----------------------------------------------------------------------------

    def start_replay(self, record: Record, inputs: list[torch.Tensor], order: int | None = None) -> None:
        """Stage a record and its inputs, then say "go" (`order`: messages.Go); `finish_replay` collects
        the outputs."""
        self._sent_at, self._n_inputs = time.monotonic(), len(inputs)
        self.send(Stage(type="stage", record=record), inputs)
        self.expect("staged")
        if self.cpu_timed:
            self._cpu_at = thread_cpu_ns(session_members(self.pid) or [self.pid])
        self._go_at = time.perf_counter()
        self.send(Go(type="go") if order is None else Go(type="go", order=order))

    def finish_replay(self, limit: int) -> tuple[list, list, float, Done]:
        """(outputs, inputs afterwards, seconds, "done"). The seconds: on CUDA the replayer's event time
        (no candidate Python runs in a CUDA replayer); on CPU, for a `cpu_timed` replayer, the CPU time its
        processes ran from "go" until every output byte arrived, read by the judge from /proc (a CPU
        replayer interprets the candidate's kernels: its word counts for nothing; the wall clock would also
        count other work's turns on shared cores), else the judge's wall clock."""
        received, got = self.receive(limit)
        wall = time.perf_counter() - self._go_at
        done: Done | Error = parse(received, "done", "error")
        if done["type"] == "error":
            raise refusal(done)
        n = done["outputs"]
        if not 0 <= n <= len(got) or len(got) - n != self._n_inputs:
            raise wire.ProtocolError("replay outputs with the wrong number of tensors")
        self.busy_s += time.monotonic() - self._sent_at
        elapsed = done["elapsed_s"]
        seconds = float(elapsed) if not self.device.interpreted and elapsed is not None else self._cpu_seconds(wall)
        return got[:n], got[n:], seconds, done

    def _cpu_seconds(self, wall: float) -> float:
        """The replay's CPU time since `start_replay`; the wall clock when none was taken there, a thread
        that ran before it ended meanwhile (its time would be lost) or the kernel keeps no count."""
        if not self._cpu_at:
            return wall
        before, after = self._cpu_at, thread_cpu_ns(session_members(self.pid) or [self.pid])
        ran = sum(after.values()) - sum(before.values())
        if ran <= 0 or any(key not in after for key in before):
            return wall
        return ran / 1e9

    def death(self) -> str:
        """How the process ended, once its channel closed: 'exit status N' or 'killed by signal X'."""
        self.status = code = self._wait(self.pid, 2.0)
        if code is None:
            return "it closed its channel"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"

    def log_tail(self) -> str:
        """The candidate's last output, display-safe (its escape sequences never reach a terminal)."""
        return safe_text(read_log_tail(self.log_fd), multiline=True)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        kill_session(self.pid)
        if self.status is None:
            self._wait(self.pid, 30.0)  # reap it (and keep the fork server's replies in step)
        self._sock.close()
        os.close(self.log_fd)

