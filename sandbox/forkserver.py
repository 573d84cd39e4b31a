"""A pre-warmed process that forks one fresh child per candidate.

`serve(FD)` (in `python -c`) imports torch, triton and the op library once (no CUDA or
OpenMP initialised), then serves jobs over the Unix socket FD: the judge sends a job (JSON) with
the write end of a fresh pipe attached (SCM_RIGHTS); the server forks, replies with the child's
pid, waits for it and replies with its exit status. The child runs sandbox.worker.child_main and
writes its results to the pipe. The server is started with an allowlisted environment, so the
judge's secrets (API keys, tokens) are never in a candidate's memory or /proc/self/environ.

`sandbox.worker.run_fresh` runs the same child in a fresh interpreter (job on stdin, pipe on FD).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sandbox.guards import ENV_KEEP

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_LEN = struct.Struct("!I")


def clean_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _send_msg(sock: socket.socket, payload: dict[str, Any], fds: list[int] = ()) -> None:
    data = json.dumps(payload).encode()
    socket.send_fds(sock, [_LEN.pack(len(data)) + data], list(fds))


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk, got_fds, _, _ = socket.recv_fds(sock, n - len(buf), 4)
        fds.extend(got_fds)
        if not chunk:
            raise EOFError("fork server connection closed")
        buf += chunk
    return buf


def _recv_msg(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds: list[int] = []
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, fds))
    return json.loads(_recv_exact(sock, n, fds)), fds


class ChildHandle:
    """One running candidate process: its pid, its result pipe, and how to learn its exit status."""

    def __init__(self, pid: int, conn: Connection, wait: Any) -> None:
        self.pid, self.conn, self._wait = pid, conn, wait

    def exit_status(self, timeout: float) -> int | None:
        """waitpid-style: negative = killed by that signal. None if not known within `timeout` seconds."""
        return self._wait(timeout)


class ForkServer:
    """The judge's handle on a fork server process (started lazily, restarted if it died)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def _ensure(self) -> socket.socket:
        if self._proc is None or self._proc.poll() is not None:
            ours, theirs = socket.socketpair()
            self._proc = subprocess.Popen(
                [sys.executable, "-c", f"from sandbox.forkserver import serve; serve({theirs.fileno()})"],
                env=clean_env(), pass_fds=[theirs.fileno()], cwd="/", stdin=subprocess.DEVNULL)
            theirs.close()
            self._sock = ours
        return self._sock

    def start(self, job: dict[str, Any]) -> ChildHandle:
        sock = self._ensure()
        r, w = os.pipe()
        try:
            _send_msg(sock, job, [w])
        finally:
            os.close(w)
        reply, _ = _recv_msg(sock)

        def wait(timeout: float) -> int | None:
            sock.settimeout(timeout)
            try:
                return _recv_msg(sock)[0]["status"]
            except TimeoutError:
                return None
            except (EOFError, OSError, ValueError, KeyError):  # the server died: start a new one next time
                self.close()
                return None
            finally:
                if self._sock is sock:
                    sock.settimeout(None)

        return ChildHandle(reply["pid"], Connection(r, writable=False), wait)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = self._sock = None


def start_fresh(job: dict[str, Any]) -> ChildHandle:
    """The same child in a fresh interpreter (no fork server): the slow path and the benchmark's reference."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", f"from sandbox.worker import run_fresh; run_fresh({w})"], env=clean_env(), pass_fds=[w],
                            stdin=subprocess.PIPE, cwd="/")
    os.close(w)
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()

    def wait(timeout: float) -> int | None:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    return ChildHandle(proc.pid, Connection(r, writable=False), wait)


def _waitstatus(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(fd: int) -> None:
    from sandbox import worker  # the warm-up: torch, triton, the op library

    sock = socket.socket(fileno=fd)
    while True:
        try:
            job, fds = _recv_msg(sock)
        except (EOFError, OSError):
            return
        pid = os.fork()
        if pid == 0:  # the candidate's process
            sock.close()
            worker.child_main(Connection(fds[0], readable=False), job)  # never returns
        os.close(fds[0])
        _send_msg(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send_msg(sock, {"status": _waitstatus(status)})
