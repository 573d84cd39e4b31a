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
    server = ForkServer("cuda")
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



@pytest.mark.parametrize("device, expected", [("cuda", 0.25), ("cpu", None)])
def test_replay_seconds_are_cuda_events_on_cuda_and_the_judges_clock_on_cpu(device: str, expected) -> None:  # noqa: ANN001
    """A CUDA replayer runs no candidate Python, so its event time is the measurement; a CPU replayer
    interprets the candidate's kernels, so what it reports is ignored for the judge's own clock."""
    import socket

    import torch

    from kernelloop.sandbox import wire

    ours, theirs = socket.socketpair()
    try:
        child = Child.__new__(Child)  # the protocol only: no process behind it
        child.chan, child.deadline, child.device, child.busy_s = wire.Channel(ours.fileno()), time.monotonic() + 5, device, 0.0
        child._check_memory = lambda: None
        child._sent_at, child._n_inputs, child._go_at = time.monotonic(), 1, time.perf_counter()
        out, after = torch.ones(3), torch.zeros(2)
        wire.Channel(theirs.fileno()).send({"type": "done", "elapsed_s": 0.25, "error": None, "outputs": 1,
                                             "violations": []}, [out, after])
        got, inputs_after, seconds, done = child.finish_replay(1 << 20)
        assert torch.equal(got[0], out) and torch.equal(inputs_after[0], after) and done["elapsed_s"] == 0.25
        assert seconds == expected if expected is not None else 0 <= seconds < 0.25
    finally:
        ours.close()
        theirs.close()
