"""Runtime guards, installed inside the candidate's process before its module is imported.

They hold without the static pre-check: the tests switch that off and replay every exploit.
- `isolate`: own session (killable process group), rlimits, no network (a fresh network
  namespace where the kernel allows one), an allowlisted environment, cwd and HOME in scratch.
- an audit hook (cannot be removed once added) that blocks writes outside scratch, sockets,
  processes, ctypes, gc introspection, tracing and rlimit changes, recording each attempt;
- `candidate_builtins`: the candidate module's builtins, with `__import__` limited to the
  allowlist and the escape hatches (open, eval, exec, ...) replaced by recorders;
- `TorchGuard`: a TorchDispatchMode allowing allocation, view, copy and fill ops only, which can
  poison every fresh allocation with NaN (or -1) so unwritten outputs cannot pass;
- `LaunchGuard`: counts Triton launches, and can suppress them.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox.static_check import ALLOWED_IMPORTS, FORBIDDEN_NAMES

VIOLATIONS: list[str] = []  # every blocked attempt, in order; read by the worker after each call

ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH")
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


class SandboxViolation(PermissionError):
    pass


def _violation(message: str) -> SandboxViolation:
    VIOLATIONS.append(message)
    return SandboxViolation(f"kernelloop sandbox: {message}")


def _new_network_namespace() -> str:
    """An empty network namespace (loopback down, no routes) via an unprivileged user namespace.

    Must run while the process is single-threaded (right after fork). Returns how the network is cut.
    """
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return "audit-hook (no user namespaces here: " + os.strerror(ctypes.get_errno()) + ")"
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        try:
            Path(path).write_text(text)
        except OSError:
            pass
    return "namespace + audit-hook"


def isolate(scratch: Path, memory_mb: int, cpu_seconds: int, device: str) -> dict[str, str]:
    """Cut the process off from the machine; returns a description for the verdict."""
    os.setsid()
    facts = {"process_group": "own session"}
    # CUDA inside a fresh user namespace is untested here: on CUDA the audit hook alone cuts the network.
    facts["network"] = _new_network_namespace() if device == "cpu" else "audit-hook"
    limits = {
        resource.RLIMIT_NPROC: _user_tasks() + 64,  # counts threads of every process of the user; root is exempt
        resource.RLIMIT_CPU: cpu_seconds,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_FSIZE: 256 << 20,
        resource.RLIMIT_CORE: 0,
    }
    if device == "cpu":  # CUDA reserves huge address ranges: there the parent watches RSS instead
        limits[resource.RLIMIT_AS] = _address_space_bytes() + (memory_mb << 20)
    for which, value in limits.items():
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    facts["limits"] = (f"cpu {cpu_seconds}s, 256 files, 256 MiB files, processes/threads +64, "
                       + (f"address space +{memory_mb} MiB" if device == "cpu" else f"RSS {memory_mb} MiB (judge)"))
    keep = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update(HOME=str(scratch), TMPDIR=str(scratch), TRITON_CACHE_DIR=str(scratch / "triton-cache"),
                      OMP_NUM_THREADS="1")
    os.chdir(scratch)
    facts["filesystem"] = f"writes only under {scratch}"
    return facts


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


def _address_space_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def redirect_output(log_path: Path) -> None:
    """The candidate's stdout and stderr go to a file: data for the verdict, never a channel."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_BLOCKED_EVENTS = {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill",
                   "os.killpg", "pty.spawn", "resource.setrlimit", "resource.prlimit",
                   "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                   "code.__new__", "pickle.find_class", "sys.addaudithook", "os.chdir", "webbrowser.open"}


def install_audit_hook(scratch: Path, allowed_executables: frozenset[str]) -> None:
    root = os.path.realpath(scratch) + os.sep
    writable = (root, "/dev/null")

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
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writes and outside(path):
                raise _violation(f"write to {path} outside the scratch directory")
        elif event in _PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and outside(path):
                    raise _violation(f"{event} on {path} outside the scratch directory")
        elif event.startswith(("socket.", "ctypes.")) or event in _BLOCKED_EVENTS:
            raise _violation(f"{event} is not allowed")
        elif event == "subprocess.Popen":
            executable, argv = args[0], args[1]
            name = os.path.basename(os.fsdecode(executable or (argv[0] if argv else "")))
            if name not in allowed_executables:
                raise _violation(f"starting a process ({name}) is not allowed")

    sys.addaudithook(hook)


def candidate_builtins() -> dict[str, Any]:
    """Builtins for the candidate's module: imports limited to the allowlist, escape hatches refused."""
    real_import = builtins.__import__

    def guarded_import(name: str, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level or name.split(".")[0] not in ALLOWED_IMPORTS:
            raise _violation(f"import of {name!r} is not allowed")
        return real_import(name, globals, locals, fromlist, level)

    def refused(name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            raise _violation(f"{name}() is not allowed")
        return call

    table = dict(vars(builtins))
    table["__import__"] = guarded_import
    for name in FORBIDDEN_NAMES - {"SystemExit", "__import__"}:
        if name in table:
            table[name] = refused(name)
    return table


# aten ops a candidate's Python side may run: allocation, views, copies and fills; nothing that computes.
ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "arange", "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "t",
    "transpose", "permute", "expand", "squeeze", "unsqueeze", "select", "slice", "split", "split_with_sizes",
    "unbind", "narrow", "view_as", "alias", "detach", "lift_fresh", "clone", "copy_", "_to_copy", "set_",
    "cat", "stack", "resize_", "_local_scalar_dense", "unfold", "diagonal", "movedim", "chunk",
    "resolve_conj", "resolve_neg", "is_same_size", "_has_compatible_shallow_copy_type", "contiguous",
    "record_stream",
})
_ALLOCATORS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})


class TorchGuard(TorchDispatchMode):
    """Records aten ops outside ALLOWED_ATEN; optionally poisons fresh allocations."""

    def __init__(self, poison: bool) -> None:
        super().__init__()
        self.poison = poison
        self.forbidden: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.overloadpacket.__name__
        if name not in ALLOWED_ATEN:
            self.forbidden.append(str(func))
        out = func(*args, **(kwargs or {}))
        if self.poison and name in _ALLOCATORS and isinstance(out, torch.Tensor):
            out.fill_(float("nan") if out.is_floating_point() else -1)
        return out


class LaunchGuard:
    """Counts Triton launches (compiled and interpreted) and can suppress them."""

    def __init__(self) -> None:
        self.launches = 0
        self.suppress = False
        from triton.runtime import interpreter, jit

        for cls in (jit.JITFunction, interpreter.InterpretedFunction):
            self._wrap(cls)

    def _wrap(self, cls: type) -> None:
        original = cls.run
        guard = self

        def run(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN001
            if kwargs.get("warmup"):
                return original(self, *args, **kwargs)
            guard.launches += 1
            if guard.suppress:
                return None
            return original(self, *args, **kwargs)

        cls.run = run
