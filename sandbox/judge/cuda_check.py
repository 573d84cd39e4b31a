"""Whether a confined process can use CUDA; where it cannot, which confinement layer breaks it.

A candidate's process is confined (sandbox/inside/confine.py: namespaces, Landlock, capabilities, seccomp;
then the limits of sandbox/inside/guards.py) before it touches the GPU, and nothing on a CPU machine shows
that CUDA still initialises under all of that. `check()` answers it on the machine at hand: a fresh
interpreter (`python -m kernelloop.sandbox.judge.cuda_check`: no CUDA state to inherit) forks a child that
confines itself as a candidate's process does, initialises CUDA and runs one kernel. The judge runs it
once per process before judging on a GPU (sandbox/judge/orchestrator.py), so a machine whose confinement breaks
CUDA is one clear error, never a `crash` verdict for every candidate.

`python -m kernelloop.sandbox.judge.cuda_check --layers` tries each layer alone and the layers cumulatively
and prints a table with each failure's full text: a GPU lease has one try, so it says at once which
layer to change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kernelloop import IMPORT_ROOT
from kernelloop.kernels.device import CUDA

CHILD_TIMEOUT_S = 120  # CUDA context creation on a cold H200: a few seconds
LIMITS = "limits"  # sandbox/inside/guards.py's isolate(), after confine(): not a layer of confine() itself


def _exercise_cuda() -> None:
    """What every sandboxed CUDA process does first: initialise CUDA, allocate, run a kernel, read back."""
    import torch

    torch.cuda.init()
    x = torch.arange(4, dtype=torch.float32, device="cuda")
    got = float((x * 2).sum())
    if got != 12.0:
        raise RuntimeError(f"a CUDA kernel computed {got}, expected 12.0")


def name_a_new_thread() -> None:
    """The rehearsal's stand-in for CUDA on a CPU machine: what cuInit needs of the confinement beyond the
    device files, naming a helper thread it started (its creator writes /proc/self/task/<tid>/comm)."""
    import ctypes
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        rc = ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(worker.ident), b"cuda-helper")
        if rc:
            raise OSError(rc, f"pthread_setname_np: {os.strerror(rc)}")
    finally:
        stop.set()
        worker.join()


def run_confined(layers: tuple[str, ...], limits: bool, work=_exercise_cuda) -> str | None:
    """A child that applies `layers` of confine() (and the limits when `limits`), then runs `work`
    (sandbox/inside/confine.py run_confined); None when it succeeded, else its full error text. The caller
    must not have initialised CUDA (a forked child cannot use a parent's CUDA state)."""
    from kernelloop.sandbox.inside import confine
    from kernelloop.sandbox.inside.guards import isolate

    def setup_then_work(scratch: Path) -> None:
        os.environ.update(HOME=str(scratch), TMPDIR=str(scratch))  # as sandbox/inside/worker.py's setup
        tempfile.tempdir = str(scratch)
        if limits:
            isolate(scratch, memory_mb=4096, cpu_seconds=CHILD_TIMEOUT_S, device=CUDA)
        work()

    return confine.run_confined(setup_then_work, layers, timeout_s=CHILD_TIMEOUT_S)


def diagnose(work=_exercise_cuda) -> list[tuple[str, str]]:
    """(layers applied, "ok" or the error) for: none, each layer alone, then the layers cumulatively."""
    from kernelloop.sandbox.inside.confine import LAYERS

    plans: list[tuple[tuple[str, ...], bool]] = [((), False)]
    plans += [((layer,), False) for layer in LAYERS] + [((), True)]
    plans += [(LAYERS[: i + 1], False) for i in range(1, len(LAYERS))] + [(LAYERS, True)]
    rows = []
    for layers, limits in plans:
        name = " + ".join([*layers, *([LIMITS] if limits else [])]) or "none (prctl only)"
        rows.append((name, run_confined(layers, limits, work) or "ok"))
    return rows


_CHECKED: list[str | None] = []


def check() -> str | None:
    """None when CUDA works in a fully confined process on this machine, else the reason; asked once
    per process, in a fresh interpreter (this one may already hold CUDA state)."""
    if not _CHECKED:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(IMPORT_ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "kernelloop.sandbox.judge.cuda_check", "--json"], env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S + 60)
        try:
            _CHECKED.append(json.loads(proc.stdout.strip().splitlines()[-1])["error"])
        except (IndexError, ValueError, KeyError):
            tail = " ".join((proc.stderr or proc.stdout).split())[-500:]
            _CHECKED.append(f"the CUDA check itself failed (exit {proc.returncode}): {tail}")
    return _CHECKED[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelloop.sandbox.judge.cuda_check", description=__doc__.split("\n")[0])
    parser.add_argument("--layers", action="store_true", help="try each confinement layer alone and cumulatively")
    parser.add_argument("--json", action="store_true", help="print {\"error\": null | text} (the judge reads it)")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: check CUDA's stand-in (naming a helper thread) instead of CUDA")
    args = parser.parse_args(argv)
    from kernelloop.sandbox.inside.confine import LAYERS

    work = name_a_new_thread if args.rehearse else _exercise_cuda
    if args.layers:
        rows = diagnose(work)
        width = max(len(name) for name, _ in rows)
        for name, outcome in rows:
            print(f"{name:<{width}}  {outcome}", flush=True)
        return 0 if rows[-1][1] == "ok" else 1
    error = run_confined(LAYERS, limits=True, work=work)
    print(json.dumps({"error": error}) if args.json else (error or "ok: CUDA works in a fully confined process"))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
