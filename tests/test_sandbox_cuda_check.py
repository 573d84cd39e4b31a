"""sandbox.judge.cuda_check: can a confined process use CUDA, and which layer breaks it where it cannot.

No GPU here, so the work done in the confined child stands in for what CUDA needs: cuInit names the
helper threads it starts by writing /proc/self/task/<tid>/comm (glibc's pthread_setname_np for
another thread), and fails with CUDA error 304 where it cannot; that is how every sandboxed process
failed on the first H200 run. The real check (`python -m kernelloop.sandbox.judge.cuda_check`) runs in
bench/gpu_check.sh's sandbox-cuda step.
"""

from __future__ import annotations

import json
import subprocess
import sys

from kernelloop.sandbox.inside.confine import LAYERS
from kernelloop.sandbox.judge import cuda_check


def write_process_comm() -> None:
    """Something Landlock refuses (and nothing else does): a /proc file outside the own task files."""
    with open("/proc/self/comm", "w") as f:
        f.write("renamed")


def test_thread_naming_works_under_every_layer_and_the_limits():
    assert cuda_check.run_confined(LAYERS, limits=True, work=cuda_check.name_a_new_thread) is None


def test_the_layer_that_breaks_the_work_is_named_and_the_error_kept_whole():
    rows = dict(cuda_check.diagnose(work=write_process_comm))
    assert rows["none (prctl only)"] == "ok" and rows["namespaces"] == "ok" and rows["seccomp"] == "ok"
    assert rows["landlock"].startswith("PermissionError: [Errno 13]") and "/proc/self/comm" in rows["landlock"]
    full = " + ".join([*LAYERS, "limits"])
    assert full in rows and rows[full].startswith("PermissionError")
    assert len(rows) == 1 + len(LAYERS) + 1 + (len(LAYERS) - 1) + 1


def test_a_failure_inside_the_child_comes_back_as_text_not_a_crash():
    def boom() -> None:
        raise RuntimeError("Unexpected error from cudaGetDeviceCount(). " + "x" * 300 + " Error 304: OS call failed")

    error = cuda_check.run_confined(LAYERS, limits=True, work=boom)
    assert error.startswith("RuntimeError: Unexpected error") and error.endswith("Error 304: OS call failed")


def test_the_command_reports_json_and_fails_without_cuda():
    proc = subprocess.run([sys.executable, "-m", "kernelloop.sandbox.judge.cuda_check", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert "CUDA" in error  # this CPU build of torch: "Torch not compiled with CUDA enabled"
    rehearsal = subprocess.run([sys.executable, "-m", "kernelloop.sandbox.judge.cuda_check", "--layers", "--rehearse"],
                               capture_output=True, text=True, timeout=300)
    assert rehearsal.returncode == 0 and rehearsal.stdout.count(" ok\n") == 1 + len(LAYERS) + 1 + len(LAYERS)
