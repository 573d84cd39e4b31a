"""Python-level guards: the second layer, inside a sandboxed process, after sandbox/inside/confine.py.

The operating system (confine.py) is what confines a candidate; these make attempts visible and
named in the verdict, and close what is cheap to close in Python:
- `isolate`: rlimits, an allowlisted environment, cwd, HOME and TMPDIR in scratch.
- an audit hook (cannot be removed once added) that blocks writes outside scratch, sockets,
  processes other than the allowed executables, ctypes, gc introspection, tracing and rlimit
  changes, recording each attempt even when the candidate swallows the exception;
- the candidate module's builtins are kernels/candidate/guarded_builtins.py's (shared with the
  registry loader); blocked attempts of both are recorded in the same VIOLATIONS list.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path
from typing import Any

from kernelloop.kernels.candidate.guarded_builtins import VIOLATIONS  # noqa: F401  (VIOLATIONS: the worker reads guards.VIOLATIONS)
from kernelloop.kernels.candidate.guarded_builtins import violation as _violation
from kernelloop.kernels.device import Device

ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH")


def isolate(scratch: Path, memory_mb: int, cpu_seconds: int, device: Device) -> dict[str, str]:
    """Limits, environment and working directory (after sandbox.inside.confine); returns facts for the verdict.
    On CUDA the memory limit comes later (`limit_memory`, once the CUDA context exists)."""
    facts = {}
    _set_limits({
        resource.RLIMIT_NPROC: _user_tasks() + 64,  # counts threads of every process of the user; root is exempt
        resource.RLIMIT_CPU: cpu_seconds,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_FSIZE: 256 << 20,
        resource.RLIMIT_CORE: 0,
    })
    memory = limit_memory(memory_mb) if device.interpreted else (
        f"private memory +{memory_mb} MiB from the CUDA warm-up on; RSS {memory_mb} MiB (judge)")
    facts["limits"] = f"cpu {cpu_seconds}s, 256 files, 256 MiB files, processes/threads +64, {memory}"
    keep = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update(HOME=str(scratch), TMPDIR=str(scratch), TRITON_CACHE_DIR=str(scratch / "triton-cache"),
                      OMP_NUM_THREADS="1")
    os.chdir(scratch)
    facts["filesystem"] = f"writes only under {scratch}"
    return facts


def limit_memory(memory_mb: int, address_space: bool = True) -> str:
    """Cap what this process can still allocate at `memory_mb` more than it holds now, where the allocation
    happens: an mmap or brk past the limit fails at once (MemoryError, torch's "can't allocate memory"),
    however fast or slowly the pages would have been touched. RLIMIT_DATA counts private writable memory
    (heap, anonymous mappings: Python objects, numpy arrays, CPU tensors); RLIMIT_AS, on CPU, every
    mapping (CUDA reserves huge address ranges, so not there). Soft and hard limits are equal, so the
    process cannot raise them: that needs CAP_SYS_RESOURCE in the initial user namespace, which no
    sandboxed process has (and the audit hook refuses resource.setrlimit/prlimit besides). The judge still
    polls the session's resident memory: the second layer (shared mappings, other processes).
    Returns the fact for the verdict."""
    status = _vm_status()
    limits = {resource.RLIMIT_DATA: status.get("VmData", 0) + (memory_mb << 20)}
    if address_space:
        limits[resource.RLIMIT_AS] = status.get("VmSize", 0) + (memory_mb << 20)
    _set_limits(limits)
    return f"private memory{' and address space' if address_space else ''} +{memory_mb} MiB (hard limits)"


def _set_limits(limits: dict[int, int]) -> None:
    """Soft = hard = value (never above a hard limit already set): a limit the process cannot raise."""
    for which, value in limits.items():
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _user_tasks() -> int:
    """Threads of all of this user's processes: what RLIMIT_NPROC counts."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return count


def _vm_status() -> dict[str, int]:
    """This process's Vm* figures from /proc/self/status, in bytes."""
    figures = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Vm") and line.endswith("kB"):
            name, value = line.split(":", 1)
            figures[name] = int(value.split()[0]) * 1024
    return figures


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it came from, is an allocation the memory limit refused."""
    seen = 0
    while exc is not None and seen < 16:
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001  (a candidate's exception whose __str__ raises)
            text = ""
        if isinstance(exc, MemoryError) or memory_refused(text):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def memory_refused(text: str) -> bool:
    """Whether an error's text says an allocation was refused (Python, torch's allocator, errno ENOMEM)."""
    return text.startswith("MemoryError") or any(
        s in text for s in ("can't allocate memory", "Cannot allocate memory", "out of memory", "MemoryError:"))


def redirect_output(log_path: Path) -> None:
    """The candidate's stdout and stderr go to a file: data for the verdict, never a channel."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"})
_BLOCKED_EVENTS = frozenset({
    "os.system", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "resource.setrlimit",
    "resource.prlimit", "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "code.__new__", "pickle.find_class", "sys.addaudithook", "os.chdir", "webbrowser.open"})


def install_audit_hook(scratch: Path, allowed_executables: frozenset[str]) -> None:
    root = os.path.realpath(scratch) + os.sep
    writable = (root, "/dev/null")
    path_events, blocked_events, write_flags = _PATH_EVENTS, _BLOCKED_EVENTS, _WRITE_FLAGS

    def outside(path: Any) -> bool:
        if isinstance(path, int):
            return False  # an fd the process already holds
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        real = os.path.realpath(os.path.join(root, os.fspath(path)))
        return not (real + os.sep).startswith(writable[0]) and real != writable[1]

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & write_flags)
            if writes and outside(path):
                raise _violation(f"write to {path} outside the scratch directory")
        elif event in path_events:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and outside(path):
                    raise _violation(f"{event} on {path} outside the scratch directory")
        elif event.startswith(("socket.", "ctypes.")) or event in blocked_events:
            raise _violation(f"{event} is not allowed")
        elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
            executable, argv = args[0], args[1]
            path = os.fsdecode(executable or (argv[0] if argv else ""))
            if path not in allowed_executables and os.path.realpath(path) not in allowed_executables:
                raise _violation(f"starting a process ({os.path.basename(path)}) is not allowed")

    sys.addaudithook(hook)
