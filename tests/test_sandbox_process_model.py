"""The GPU process model, proven on a CPU machine.

- The fork server never initialises CUDA: inside it `torch.cuda.is_available` and friends raise, and
  it still starts and serves (set up for `cuda`, i.e. compiled Triton, not the interpreter).
- A sandboxed process set up the way the sandbox sets up every candidate's process (confinement,
  limits, environment, audit hook) has `tempfile` pointing into its scratch, may start Triton's
  bundled ptxas and nothing else, and compiles an op's kernel for sm90 to a cubin there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelloop.kernels.device import CUDA, Device
from kernelloop.sandbox.judge.children import Child
from kernelloop.sandbox.judge.executables import ptxas
from kernelloop.sandbox.judge.forkserver import ForkServer

REPO = Path(__file__).resolve().parent.parent

_COMPILE_IN_CHILD = r'''
import contextlib, io, json, os, re, subprocess, sys, tempfile
from pathlib import Path
from kernelloop.sandbox.judge import forkserver
saved = forkserver._forbid_cuda()  # as in the fork server: CUDA must not be needed before the fork
import torch, triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from kernelloop.kernels.ops import rmsnorm_kernel
from kernelloop.sandbox.inside import guards
from kernelloop.sandbox.inside import worker

scratch, ptxas = Path(sys.argv[1]), sys.argv[2]
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    result = {}
    try:
        job = {"scratch": str(scratch), "memory_mb": 4096, "cpu_seconds": 300, "device": "cpu",
               "allow_exec": [ptxas], "confine": True}
        result["isolation"] = worker._setup(job)
        guards.install_audit_hook(scratch, frozenset([ptxas]))
        result["tempdir"] = tempfile.gettempdir()
        with tempfile.NamedTemporaryFile() as f:
            result["tempfile"] = f.name
        knobs.nvidia.dump_ptxas_log = True
        src = triton.compiler.ASTSource(
            fn=rmsnorm_kernel._rmsnorm_kernel,
            signature={"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "x_row_stride": "i32",
                       "y_row_stride": "i32", "n_cols": "i32", "eps": "fp32", "BLOCK_N": "constexpr"},
            constexprs={"BLOCK_N": 4096})
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        regs = re.search(r"Used (\d+) registers", log.getvalue())
        result["cubin_bytes"] = len(compiled.asm["cubin"])
        result["registers"] = int(regs.group(1)) if regs else None
        result["spills"] = "0 bytes spill stores" in log.getvalue()
        try:
            subprocess.run(["/bin/sh", "-c", "true"])
            result["sh"] = "ran"
        except BaseException as exc:
            result["sh"] = type(exc).__name__
        result["violations"] = guards.VIOLATIONS[:3]
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    os.write(write, json.dumps(result).encode())
    os._exit(0)
os.close(write)
data = b""
while chunk := os.read(read, 65536):
    data += chunk
os.waitpid(pid, 0)
print(json.dumps(json.loads(data)))
'''


def test_the_fork_server_never_initialises_cuda(tmp_path: Path) -> None:
    """Set up for CUDA (compiled Triton) on a machine without one: CUDA entry points raise in the server,
    so had anything touched CUDA before the fork, the server would not have served this child."""
    server = ForkServer(CUDA)
    child = None
    try:
        job = {"role": "replay", "op": "rmsnorm", "device": "cpu", "source": None, "filename": "baseline",
               "constants": {}, "memory_mb": 2048, "cpu_seconds": 60, "allow_exec": [], "confine": True}
        child = Child(server, job, tmp_path / "scratch", 2048, time.monotonic() + 120)
        ready, _ = child.receive()
        assert ready["type"] == "ready", ready
        load, _ = child.receive()
        assert load == {"type": "load", "ok": True, "error": None, "constants": {}, "violations": [], "tensors": []}, load
    finally:
        if child is not None:
            child.close()
        server.close()
    probe = subprocess.run(
        [sys.executable, "-c", "from kernelloop.sandbox.judge import forkserver; forkserver._forbid_cuda(); import torch\n"
                               "try:\n    torch.cuda.is_available()\nexcept RuntimeError as e:\n    print(e)"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert "must never initialise CUDA" in probe.stdout, probe.stderr[-2000:]


@pytest.mark.skipif(ptxas() is None, reason="this triton build has no bundled ptxas")
def test_a_sandboxed_process_compiles_for_sm90_and_starts_nothing_else(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_INTERPRET="0", PYTHONPATH=str(REPO))  # compiled Triton, as on a GPU machine
    proc = subprocess.run([sys.executable, "-c", _COMPILE_IN_CHILD, str(scratch), ptxas()], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    assert result["isolation"]["namespaces"].startswith("user") and "seccomp" in result["isolation"]
    assert result["tempdir"] == str(scratch) and result["tempfile"].startswith(str(scratch))
    assert result["cubin_bytes"] > 1000 and result["spills"], result
    assert result["registers"] and result["registers"] <= 255
    assert result["sh"] != "ran" and any("sh" in v for v in result["violations"]), result
    assert not any("ptxas" in v for v in result["violations"]), result



def _replaying_child(device: str, pid: int, chan_fd: int) -> Child:
    """A Child with only its protocol side set up, standing for the process `pid`."""
    from kernelloop.sandbox import wire

    child = Child.__new__(Child)
    child.chan, child.deadline, child.device, child.busy_s = wire.Channel(chan_fd), time.monotonic() + 5, Device.of(device), 0.0
    child.pid, child._check_memory = pid, lambda: None
    child._sent_at, child._n_inputs, child._go_at, child._cpu_at = time.monotonic(), 1, time.perf_counter(), {}
    return child


def _send_done(fd: int, elapsed: float) -> tuple:
    import torch

    from kernelloop.sandbox import wire

    out, after = torch.ones(3), torch.zeros(2)
    wire.Channel(fd).send({"type": "done", "elapsed_s": elapsed, "error": None, "outputs": 1, "violations": []},
                          [out, after])
    return out, after


@pytest.mark.parametrize("device, expected", [("cuda", 0.25), ("cpu", None)])
def test_replay_seconds_are_cuda_events_on_cuda_and_never_the_childs_word_on_cpu(device: str, expected) -> None:  # noqa: ANN001
    """A CUDA replayer runs no candidate Python, so its event time is the measurement; a CPU replayer
    interprets the candidate's kernels, so what it reports is ignored for the judge's own measure."""
    import socket

    import torch

    ours, theirs = socket.socketpair()
    try:
        child = _replaying_child(device, os.getpid(), ours.fileno())
        out, after = _send_done(theirs.fileno(), 0.25)
        got, inputs_after, seconds, done = child.finish_replay(1 << 20)
        assert torch.equal(got[0], out) and torch.equal(inputs_after[0], after) and done["elapsed_s"] == 0.25
        assert seconds == expected if expected is not None else 0 <= seconds < 0.25
    finally:
        ours.close()
        theirs.close()


_SLEEPY = """
import sys, time
sys.stdout.write("up\\n"); sys.stdout.flush()
while True:
    x = 0
    for i in range(100_000):
        x += i
    time.sleep(0.1)
"""


def test_cpu_replay_seconds_are_the_replayers_cpu_time_not_the_wall_clock() -> None:
    """On CPU the judge reads the replayer's CPU time from /proc: a process that mostly waits (as one
    does while other work holds the cores) is charged what it ran, not the wall clock between go and done."""
    import socket

    from kernelloop.sandbox.judge.children import thread_cpu_ns

    proc = subprocess.Popen([sys.executable, "-c", _SLEEPY], stdout=subprocess.PIPE, text=True)
    ours, theirs = socket.socketpair()
    try:
        assert proc.stdout.readline() == "up\n"
        child = _replaying_child("cpu", proc.pid, ours.fileno())
        child._cpu_at = thread_cpu_ns([proc.pid])
        assert child._cpu_at and all(ns > 0 for ns in child._cpu_at.values())
        child._go_at = time.perf_counter()
        time.sleep(0.6)
        _send_done(theirs.fileno(), 9.0)
        _, _, seconds, _ = child.finish_replay(1 << 20)
        wall = time.perf_counter() - child._go_at
        assert 0 < seconds < wall / 2, (seconds, wall)
    finally:
        proc.kill()
        proc.wait()
        ours.close()
        theirs.close()


def test_cpu_replay_seconds_fall_back_to_the_wall_clock_when_a_thread_ended() -> None:
    """A thread that ran before "go" and is gone at "done" would take its time with it: the wall clock."""
    import socket

    ours, theirs = socket.socketpair()
    try:
        child = _replaying_child("cpu", os.getpid(), ours.fileno())
        child._cpu_at = {(os.getpid(), 1 << 30): 1}  # a thread that no longer exists
        child._go_at = time.perf_counter() - 0.5
        _send_done(theirs.fileno(), 9.0)
        _, _, seconds, _ = child.finish_replay(1 << 20)
        assert seconds >= 0.5
    finally:
        ours.close()
        theirs.close()
