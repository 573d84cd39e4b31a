"""Sandbox processes die with the process that started them, and leave Ctrl-C to the judge.

PR_SET_PDEATHSIG sends SIGKILL when the parent *thread* ends, and fork() clears it in the child, so
every sandbox process arms it itself, first thing, then checks that its parent is still the one it
was started by (the parent may have died before the signal was armed). The judge starts its fork
servers through `spawn_python`, from a thread that lives as long as the judge, so a worker thread that
ends (a langgraph node, a daemon's step) cannot take them with it.

Ctrl-C at a terminal signals the whole foreground process group: the judge handles it (it tears its
children down) and the sandbox processes, each in a session of its own, ignore SIGINT.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends; exit now if `parent` is gone already."""
    if _libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        os._exit(1)  # a sandbox process that could outlive its judge must not run at all
    if os.getppid() != parent:
        os._exit(1)


def parent_death_signal() -> int:
    """The signal armed by `die_with_parent` (0: none). Credential changes can clear it."""
    sig = ctypes.c_int(0)
    if _libc.prctl(ctypes.c_int(PR_GET_PDEATHSIG), ctypes.byref(sig), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0)) != 0:
        return 0
    return sig.value


def ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Keeper:
    """One daemon thread, alive until the judge exits, that starts processes on behalf of other threads."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="kernelloop-sandbox-spawner", daemon=True)
                self._thread.start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((fn, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001  (handed back to the caller's thread)
                done.put((False, exc))


_KEEPER = _Keeper()


def spawn_python(code: str, **kwargs: Any) -> subprocess.Popen:
    """`python -c code` from a thread that lasts as long as this process (the main thread, else the
    keeper), in a session of its own (a terminal's Ctrl-C reaches the judge, not the sandbox). Its
    first statements, before any import, arm the parent-death signal and ignore SIGINT."""
    parent = os.getpid()
    prologue = (f"import ctypes, os, signal; ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0); "
                f"os.getppid() == {parent} or os._exit(1); signal.signal(signal.SIGINT, signal.SIG_IGN)\n")
    argv = [sys.executable, "-c", prologue + code]
    kwargs.setdefault("start_new_session", True)
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kwargs)
    return _KEEPER.run(lambda: subprocess.Popen(argv, **kwargs))
