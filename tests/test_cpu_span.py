"""bench.cpu_span: whose CPU a span of work used (the cluster benchmark's busy-core columns)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.cpu_span import TICKS, CpuSpan, _process_ticks, ray_own

SPIN = "import time\nwhile time.process_time() < {s}: pass\n"  # a fixed amount of CPU, however busy the machine


def wait_for_cpu(pid: int, seconds: float) -> None:
    """Until the process has used `seconds` of CPU (ticks round down: ask a little less than it spins)."""
    deadline = time.monotonic() + 60
    while (got := _process_ticks(pid)) is None or got[1] / TICKS < seconds:
        assert time.monotonic() < deadline, "the spinner never spun"


def test_a_process_started_in_the_span_is_charged_all_its_cpu_and_the_machine_at_least_as_much() -> None:
    with CpuSpan(lambda pid, cmdline: "spinner" if "process_time() < 0.4" in cmdline else None) as span:
        child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=0.4) + "time.sleep(30)"])
        wait_for_cpu(child.pid, 0.35)
    child.kill()
    child.wait()
    spinner_s = span.shares()["spinner"] * span.seconds
    assert 0.34 <= spinner_s <= 0.6, spinner_s  # what it had used when the span ended
    assert span.cores() * span.seconds >= spinner_s * 0.95  # the machine's total holds every process's time
    assert span.shares()["driver"] > 0  # the waiting loop above spun in this process


def test_a_process_alive_before_the_span_is_charged_only_what_it_used_in_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=0.3) + "input()"], stdin=subprocess.PIPE)
    try:
        wait_for_cpu(child.pid, 0.25)
        settled = None
        while settled != (settled := _process_ticks(child.pid)):  # done spinning: waiting on input()
            time.sleep(0.1)
        with CpuSpan(lambda pid, cmdline: "idle" if pid == child.pid else None) as span:
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        assert span.shares()["idle"] * span.seconds < 0.05
    finally:
        child.kill()
        child.wait()


def test_ray_own_processes_are_told_from_the_work_they_run() -> None:
    assert ray_own(1, "/x/ray/core/src/ray/gcs/gcs_server --gcs_server_port=0") == "ray daemons"
    assert ray_own(1, "/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/x") == "ray daemons"
    assert ray_own(1, "ray::IDLE") == "ray idle workers"
    assert ray_own(1, "ray::Judge.judge") is None and ray_own(1, "python -m pytest") is None
