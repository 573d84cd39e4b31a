"""The judge's handles on sandboxed processes: start one, talk to it under a deadline, kill it.

Each child gets a socketpair end as its channel and a log file the judge created and keeps open (so
the judge reads the candidate's stdout/stderr through its own descriptor: a child that replaces the
file by a FIFO, a directory or a symlink changes nothing the judge reads). A child's whole session is
SIGKILLed when it is closed; its resident memory is watched while the judge waits on it.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any, Callable, Iterable

from sandbox import wire
from sandbox.forkserver import ForkServer, start_fresh

LOG_TAIL_BYTES = 2000
_BASE_RSS = 1 << 30  # the pre-warmed process's own footprint (torch + triton), not charged to the candidate


class MemoryExceeded(Exception):
    pass


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
    """One sandboxed process: `receive` applies the deadline and the memory limit to every read."""

    def __init__(self, server: ForkServer | None, job: dict[str, Any], scratch: Path, memory_mb: int) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        self.log_fd = os.open(scratch.parent / f"{scratch.name}.log", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.memory_bytes = (memory_mb << 20) + _BASE_RSS
        job = {**job, "scratch": str(scratch)}
        try:
            if server is not None:
                self.pid, self._wait = server.start(job, theirs.fileno(), self.log_fd), server.wait
            else:
                self.pid, wait = start_fresh(job, theirs.fileno(), self.log_fd)
                self._wait = lambda pid, timeout: wait(timeout)
        finally:
            theirs.close()
        self._sock = ours  # kept so the fd stays open
        self.chan = wire.Channel(ours.fileno())
        self.status: int | None = None
        self.closed = False

    def _check_memory(self) -> None:
        if rss_bytes(session_members(self.pid) or [self.pid]) > self.memory_bytes:
            raise MemoryExceeded()

    def receive(self, deadline: float, max_bytes: int = wire.MAX_TENSOR_BYTES) -> tuple[dict, list]:
        return self.chan.receive(deadline, max_bytes, on_wait=self._check_memory)

    def send(self, header: dict[str, Any], tensors: list = ()) -> None:
        self.chan.send(header, tensors)

    def death(self) -> str:
        """How the process ended, once its channel closed: 'exit status N' or 'killed by signal X'."""
        self.status = code = self._wait(self.pid, 2.0)
        if code is None:
            return "it closed its channel"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"

    def log_tail(self) -> str:
        return read_log_tail(self.log_fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        kill_session(self.pid)
        if self.status is None:
            self._wait(self.pid, 30.0)  # reap it (and keep the fork server's replies in step)
        self._sock.close()
        os.close(self.log_fd)


Progress = Callable[[str], None]
