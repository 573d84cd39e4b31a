"""Whose CPU a span of work used: the machine's busy cores, and the share of named long-lived processes.

`CpuSpan` reads /proc/stat (every core, every process, short-lived ones included) and the CPU time of
the processes `classify` names (read from /proc/<pid>/stat) when it starts and when it ends. A process
that starts or ends inside the span is counted from when it was first or until it was last seen, so
the named shares are for long-lived processes (a cluster's own daemons, this driver); what the span's
short-lived processes used is in the machine's total. Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _machine_busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)


def _process_ticks(pid: int) -> tuple[int, int] | None:
    """(start time, CPU ticks used) of a live process; the start time tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    return int(fields[19]), int(fields[11]) + int(fields[12])  # starttime; utime + stime


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_own(pid: int, cmdline: str) -> str | None:
    """Ray's own processes (not the work it runs): its daemons and its idle workers."""
    if "ray::IDLE" in cmdline:
        return "ray idle workers"
    if any(name in cmdline for name in ("gcs_server", "raylet", "dashboard/agent.py", "runtime_env/agent",
                                        "log_monitor.py", "_private/monitor.py", "dashboard/dashboard.py")):
        return "ray daemons"
    return None


class CpuSpan:
    """`with CpuSpan(classify) as span: ...`, then `span.cores()` (busy cores on average over the span)
    and `span.shares()` ({group: cores}) for the processes `classify(pid, cmdline)` puts in a group at
    the span's end (None: not counted apart). The calling process is its own group, "driver"."""

    def __init__(self, classify: Callable[[int, str], str | None] = ray_own) -> None:
        self.classify = classify

    @staticmethod
    def _ticks() -> dict[tuple[int, int], int]:
        out = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (got := _process_ticks(int(entry.name))) is not None:
                out[int(entry.name), got[0]] = got[1]
        return out

    def __enter__(self) -> "CpuSpan":
        self.before = self._ticks()
        self.start, self.busy0 = time.monotonic(), _machine_busy_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.start
        self.busy = _machine_busy_ticks() - self.busy0
        me, self.groups = os.getpid(), {}
        for key, ticks in self._ticks().items():  # a process started in the span: all its time is the span's
            pid = key[0]
            group = "driver" if pid == me else self.classify(pid, _cmdline(pid))
            if group:
                self.groups[group] = self.groups.get(group, 0) + ticks - self.before.get(key, 0)

    def cores(self) -> float:
        return self.busy / TICKS / max(self.seconds, 1e-9)

    def shares(self) -> dict[str, float]:
        return {group: ticks / TICKS / max(self.seconds, 1e-9) for group, ticks in self.groups.items()}
