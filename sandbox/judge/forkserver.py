"""A pre-warmed process that forks the sandboxed processes, and the judge's handle on one.

`serve(FD)` (in `python -c`) imports torch, triton and the op library once, then answers requests
over the Unix socket FD, one at a time, each tagged with an id that its reply repeats (declared in
sandbox/messages.py: StartRequest, StartReply, WaitRequest, WaitReply; the job is messages.Job):

    {"op": "start", "id": n, "job": {...}} + two fds (the child's channel end, its log file)
        -> {"id": n, "pid": p}        the child runs sandbox.inside.worker.child_main
    {"op": "wait", "id": n, "pid": p} -> {"id": n, "status": s}   (waitpid; negative: killed by signal)

The server never initialises CUDA: a child that forked from a process with CUDA state cannot use
the GPU. `torch.cuda.is_available` and friends raise inside the server (and work again in each
child), so any code path that would touch CUDA before the fork fails loudly, on CPU machines too.
It is started with an allowlisted environment (the judge's secrets are never in a candidate's
memory or /proc/self/environ), in a session of its own, ignoring SIGINT (Ctrl-C is the judge's to
handle), and dies with the judge, as each child dies with it (sandbox/lifetime.py: PR_SET_PDEATHSIG,
armed first thing in each process, with its parent checked after arming).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from typing import TYPE_CHECKING, Any

from kernelloop import IMPORT_ROOT
from kernelloop.kernels.device import Device
from kernelloop.kernels.ops import OP_PACKAGES_ENV, extra_packages, op_import_roots
from kernelloop.sandbox.inside.guards import ENV_KEEP
from kernelloop.sandbox.lifetime import die_with_parent, ignore_interrupts, spawn_python

if TYPE_CHECKING:  # (messages imports torch; the fork server imports it only in `serve`)
    from kernelloop.sandbox.messages import Job, StartReply, StartRequest, WaitReply, WaitRequest

_LEN = struct.Struct("!I")
_CUDA_ENTRY_POINTS = ("is_available", "init", "device_count", "_lazy_init", "current_device", "get_device_name",
                      "get_device_capability", "synchronize")


def clean_env(device: Device) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    # kernelloop, and the op packages outside it (kernels/ops: $KERNELLOOP_OP_PACKAGES), so the same ops load.
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(IMPORT_ROOT), *op_import_roots()]))
    if extra_packages():
        env[OP_PACKAGES_ENV] = ",".join(extra_packages())
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Decided here so that `import kernels` in the server never asks torch whether CUDA exists.
    env["TRITON_INTERPRET"] = "1" if device.interpreted else "0"
    # BLAS pools start when numpy/torch load, before confinement refuses new threads; a pool that could
    # not start spins forever in the interpreter's large tl.dot tiles. Candidates compute on one thread.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
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


class ForkServer:
    """The judge's handle on a fork server process (started lazily, restarted if it died)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._next_id = 0

    def _ensure(self) -> socket.socket:
        if self._proc is None or self._proc.poll() is not None:
            ours, theirs = socket.socketpair()
            self._proc = spawn_python(
                f"from kernelloop.sandbox.judge.forkserver import serve; serve({theirs.fileno()}, {os.getpid()})",
                env=clean_env(self.device), pass_fds=[theirs.fileno()], cwd="/", stdin=subprocess.DEVNULL)
            theirs.close()
            self._sock = ours
        return self._sock

    def _request(self, payload: dict[str, Any], fds: list[int] = (), timeout: float | None = None) -> dict | None:
        sock = self._ensure()
        self._next_id += 1
        rid = self._next_id
        try:
            _send_msg(sock, {**payload, "id": rid}, fds)
            sock.settimeout(timeout)
            while True:
                reply, _ = _recv_msg(sock)
                if reply.get("id") == rid:  # a late reply to an earlier, timed-out request is dropped
                    return reply
        except TimeoutError:
            return None
        except (EOFError, OSError, ValueError):  # the server died: start a new one next time
            self.close()
            return None
        except BaseException:  # interrupted (Ctrl-C) mid-frame: the stream may be out of step, never reuse it
            self._abandon()
            raise
        finally:
            if self._sock is sock:
                sock.settimeout(None)

    def boot(self) -> float:
        """Start the server unless it runs, and wait until it answers (torch, triton and the op library
        imported): the seconds that took, 0.0 when it was up. The judge calls it before a candidate's
        clock starts, so a slow or busy machine's start-up never counts against a candidate."""
        if self._proc is not None and self._proc.poll() is None:
            return 0.0
        started = time.monotonic()
        self._request({"op": "wait", "pid": os.getpid()}, timeout=120.0)  # the judge is never its child: answered at once
        return time.monotonic() - started

    def start(self, job: Job, chan_fd: int, log_fd: int) -> int:
        reply: StartReply | None = self._request({"op": "start", "job": job}, [chan_fd, log_fd], timeout=60.0)
        if reply is None or not isinstance(reply.get("pid"), int):
            raise RuntimeError("the sandbox's fork server did not start a process")
        return reply["pid"]

    def wait(self, pid: int, timeout: float) -> int | None:
        """`pid`'s exit status once it ended (within `timeout`), else None; None at once when the server
        that started it is gone (its children went with it: they die with their parent)."""
        if self._sock is None:
            return None
        reply: WaitReply | None = self._request({"op": "wait", "pid": pid}, timeout=timeout)
        return reply.get("status") if reply else None

    def _abandon(self) -> None:
        """Drop the server at once: SIGKILL, no goodbye (its children die with it)."""
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = self._sock = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = self._sock = None


def start_fresh(job: Job, chan_fd: int, log_fd: int) -> tuple[int, Any]:
    """The same child in a fresh interpreter (no fork server): the slow path and the benchmark's reference."""
    proc = spawn_python(
        f"from kernelloop.sandbox.inside.worker import run_fresh; run_fresh({chan_fd}, {log_fd}, {os.getpid()})",
        env=clean_env(Device.of(job["device"])), pass_fds=[chan_fd, log_fd], stdin=subprocess.PIPE, cwd="/")
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()

    def wait(timeout: float) -> int | None:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    return proc.pid, wait


def _waitstatus(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _forbid_cuda() -> dict[str, Any]:
    """Make the CUDA entry points raise in this process; returns the originals for the children."""
    import torch

    saved = {name: getattr(torch.cuda, name) for name in _CUDA_ENTRY_POINTS if hasattr(torch.cuda, name)}

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kernelloop: the sandbox's fork server must never initialise CUDA")

    for name in saved:
        setattr(torch.cuda, name, refuse)
    return saved


def serve(fd: int, judge: int) -> None:
    die_with_parent(judge)
    ignore_interrupts()  # inherited by every child
    import torch

    from kernelloop.sandbox.inside.confine import harden_current_process

    harden_current_process()  # the server exits when the judge's end of the socket closes
    saved = _forbid_cuda()
    from kernelloop.sandbox.inside import worker  # the warm-up: torch, triton, the op library

    sock = socket.socket(fileno=fd)
    while True:
        try:
            request: StartRequest | WaitRequest
            request, fds = _recv_msg(sock)
        except (EOFError, OSError, ValueError):
            return
        if request.get("op") == "wait":
            try:
                _, status = os.waitpid(int(request["pid"]), 0)
                _send_msg(sock, {"id": request["id"], "status": _waitstatus(status)})
            except ChildProcessError:
                _send_msg(sock, {"id": request["id"], "status": None})
            continue
        server = os.getpid()
        pid = os.fork()
        if pid == 0:  # the sandboxed process
            die_with_parent(server)
            sock.close()
            for name, fn in saved.items():
                setattr(torch.cuda, name, fn)
            worker.child_main(fds[0], fds[1], request["job"])  # never returns
        for f in fds:
            os.close(f)
        _send_msg(sock, {"id": request["id"], "pid": pid})
