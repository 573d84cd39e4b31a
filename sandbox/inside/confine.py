"""Confinement by the kernel for the process that runs untrusted candidate code.

`confine(policy)` runs in a freshly forked, still single-threaded child, after its channel fds are
open and before any candidate code. It applies, in order (each layer holds without the others):
1. prctl: SIGKILL when the parent dies (pdeathsig), not dumpable (no ptrace/core/ /proc reads of
   its memory by same-uid processes), no_new_privs (exec never gains privileges).
2. Namespaces: a new user namespace (uid/gid mapped to themselves, setgroups denied) so that even
   root has no capability outside it (cannot ptrace, read /proc/<pid>/environ of non-dumpable
   processes, renice or kill others by privilege), plus an empty network namespace unless
   `network`. Then every capability is dropped inside the namespace too (bounding set included).
3. Landlock (highest ABI, every fs right of it handled): read everywhere; writes, creating and
   removing files and directories only under `scratch` (plus writing /dev/null, the NVIDIA
   device files where they exist, and the files of its own threads, /proc/self/task, where CUDA
   names the threads it starts); no device nodes, FIFOs, sockets or symlinks anywhere; execute
   only the `allow_exec` files (and their ELF interpreter). ABI >= 4: no TCP bind/connect unless
   `network`. ABI >= 6: no signals to, nor abstract-unix connects out of, the Landlock domain; and
   in any ABI no ptrace-style access (/proc/<pid>/mem, environ) to processes outside the domain.
   Shared libraries are still mapped executable (mmap is not an exec for Landlock).
4. seccomp (sandbox/inside/seccomp_bpf.py): refuses debugging, namespaces, mounts, keys, modules, BPF,
   perf, io_uring, mknod, sockets (unless `network`), fork, signals to other processes, and
   process creation other than the vfork style needed to start `allow_exec` programs.
`harden_current_process()` makes the judge and fork server non-dumpable; `probe()` says whether
confine() works on this machine. A failed confine() leaves the process half-confined: exit it.

Known gaps (each stays inside every other layer, so it gives no more than native code run by the
candidate in-process): a dynamically linked `allow_exec` program brings its ELF interpreter, and
`ld.so PROGRAM` runs any program; a memfd (not a path Landlock sees) can be exec'ed; fds opened
before confine() keep their access; spawned programs do not inherit the parent-death signal (they
stay in the candidate's session). Call os.setsid() before confine() so that setsid is refused.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kernelloop.sandbox.inside import seccomp_bpf
from kernelloop.sandbox.lifetime import die_with_parent, parent_death_signal

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 3, 4, 24
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 39, 47, 4
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC = 0x10000000, 0x40000000, 0x08000000
_SECCOMP_NR = {"x86_64": 317, "aarch64": 277}
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1, 4  # SPEC_ALLOW: no forced SSB mitigation
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
# Landlock filesystem rights (ABI 1 has bits 0-12; REFER: ABI 2, TRUNCATE: ABI 3, IOCTL_DEV: ABI 5).
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE = 1, 2, 4, 8, 16, 32
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 64, 128, 256, 512, 1024, 2048, 4096
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a non-directory rule may hold
NET_BIND_TCP, NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2, 1, 2
SCRATCH_RIGHTS = READ_FILE | READ_DIR | WRITE_FILE | MAKE_REG | MAKE_DIR | REMOVE_FILE | REMOVE_DIR | TRUNCATE | REFER


@dataclass(frozen=True)
class Policy:
    scratch: Path                      # the only writable directory (create files, write, remove under it)
    allow_exec: tuple[str, ...] = ()   # absolute paths of executables that may be exec'ed; empty: no processes
    network: bool = False              # False: new empty network namespace AND no socket creation


class ConfinementError(RuntimeError):
    """confine() could not apply a layer; the message says which and what to change."""


def _call(what: str, result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfinementError(f"{what} failed: {os.strerror(err)} (errno {err})")
    return result


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> int:
    return _call(what, _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                                   ctypes.c_ulong(0), ctypes.c_ulong(0)))


def _syscall(what: str, nr: int, *args: int | bytes | None) -> int:
    return _call(what, _libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, bytes) or a is None
                                                          else ctypes.c_long(a) for a in args]))


def harden_current_process() -> None:
    """Not dumpable: same-uid processes cannot ptrace it or read its /proc/<pid>/{environ,mem,...}."""
    _prctl(PR_SET_DUMPABLE, 0, "prctl(PR_SET_DUMPABLE, 0)")


def _enter_namespaces(network: bool) -> str:
    uid, gid = os.getuid(), os.getgid()
    flags, names = ((CLONE_NEWUSER | CLONE_NEWIPC, "user+ipc") if network
                    else (CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNET, "user+ipc+net"))
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        raise ConfinementError(f"namespaces: unshare({names}) failed: {os.strerror(ctypes.get_errno())}; enable "
                               "user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, "
                               "AppArmor's restrict_unprivileged_userns, or the container's seccomp profile)")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        try:
            Path(path).write_text(text)
        except OSError as exc:
            raise ConfinementError(f"namespaces: writing {path} failed: {exc.strerror}") from None
    return names


def _drop_capabilities() -> None:
    """Inside the new user namespace the process holds every capability (of that namespace): drop them."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    _call("capset(none)", _libc.capset(header, bytes(24)))


def _elf_interpreter(path: str) -> str | None:
    """PT_INTERP of a 64-bit little-endian ELF executable (the kernel opens it for exec too)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            return None
        (phoff,), (phentsize, phnum) = struct.unpack_from("<Q", head, 32), struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if p_type == 3:
                f.seek(p_offset)
                return os.path.realpath(f.read(p_filesz).rstrip(b"\0").decode())
    return None


# This process's own threads (/proc/<pid>/task/<tid>/...): a thread's creator names it by writing its
# comm file (glibc's pthread_setname_np for another thread), and CUDA's cuInit does so for its helper
# threads, failing with error 304 where it cannot. The rule binds the procfs inode of this process's
# task directory; the O_PATH fd kept in _PINNED holds its dentry, so later lookups keep that inode.
OWN_TASKS = "/proc/self/task"
_PINNED: list[int] = []


def _nvidia_devices() -> list[str]:
    """/dev/nvidia* where they exist (nvidiactl, nvidia0, nvidia-uvm, the nvidia-caps directory, ...)."""
    return sorted(f"/dev/{name}" for name in os.listdir("/dev") if name.startswith("nvidia"))


def _landlock(policy: Policy) -> str:
    abi = _libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0),
                        ctypes.c_long(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        raise ConfinementError(f"landlock: not available ({os.strerror(ctypes.get_errno())}); boot a kernel >= 5.13 "
                               "with CONFIG_SECURITY_LANDLOCK=y and 'landlock' in the lsm= list")
    fs = (1 << 13) - 1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0) | (IOCTL_DEV if abi >= 5 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and not policy.network else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    ruleset = _syscall("landlock_create_ruleset", LANDLOCK_CREATE_RULESET, struct.pack("=QQQ", fs, net, scoped), 24, 0)
    executables = [os.path.realpath(p) for p in policy.allow_exec]
    interpreters = sorted({i for p in executables if (i := _elf_interpreter(p)) and i not in executables})
    rules = [("/", READ_FILE | READ_DIR), (str(policy.scratch), SCRATCH_RIGHTS),
             ("/dev/null", READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV)]
    rules += [(p, READ_FILE | EXECUTE) for p in executables + interpreters]
    rules += [(p, READ_FILE | WRITE_FILE | IOCTL_DEV) for p in _nvidia_devices()]
    rules += [(OWN_TASKS, READ_FILE | READ_DIR | WRITE_FILE | TRUNCATE)]
    try:
        for path, access in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                access &= fs if os.path.isdir(path) else fs & FILE_RIGHTS
                _syscall(f"landlock_add_rule({path})", LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                         struct.pack("=Qi", access, fd), 0)
            finally:
                if path == OWN_TASKS:
                    _PINNED.append(fd)
                else:
                    os.close(fd)
        _syscall("landlock_restrict_self", LANDLOCK_RESTRICT_SELF, ruleset, 0)
    except OSError as exc:
        raise ConfinementError(f"landlock: {exc.filename}: {exc.strerror}") from None
    finally:
        os.close(ruleset)
    names = ", ".join(os.path.basename(p) for p in executables) or "none"
    extra = f" (+ {', '.join(interpreters)} as ELF interpreter)" if interpreters else ""
    return (f"abi {abi}: read-only except {policy.scratch}, exec: {names}{extra}"
            + (", tcp: none" if net else "") + (", scoped: signals + abstract unix sockets" if scoped else ""))


def _seccomp(policy: Policy, machine: str) -> str:
    pid, pgid = os.getpid(), os.getpgrp()
    # kill(0) / kill(-pgid) may reach the parent when the group is shared and Landlock cannot scope signals.
    group = pgid if pgid == pid else None
    program = seccomp_bpf.build(machine, pid, group, spawn=bool(policy.allow_exec), network=policy.network,
                                deny_setsid=os.getsid(0) == pid)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    _syscall("seccomp(SET_MODE_FILTER)", _SECCOMP_NR[machine], SECCOMP_SET_MODE_FILTER,
             SECCOMP_FILTER_FLAG_SPEC_ALLOW, prog)
    spawn = "threads + vfork-style spawn" if policy.allow_exec else "threads only"
    return (f"{machine} filter, {len(program) // 8} insns: signals to self only, clone: {spawn}, no fork"
            + ("" if policy.network else ", no sockets") + "; ptrace, namespaces, mount, bpf, perf, keys, "
            "io_uring, mknod, modules refused")


def forbid_new_threads() -> str:
    """Stack a seccomp filter refusing every clone: call once the process has every thread it needs
    (after warm-up, before untrusted code runs), so untrusted code cannot start threads or processes."""
    machine = os.uname().machine
    program = seccomp_bpf.build_no_clone(machine)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    _syscall("seccomp(SET_MODE_FILTER)", _SECCOMP_NR[machine], SECCOMP_SET_MODE_FILTER,
             SECCOMP_FILTER_FLAG_SPEC_ALLOW, prog)
    return "no new threads or processes"


LAYERS = ("namespaces", "landlock", "capabilities", "seccomp")


def confine(policy: Policy, layers: tuple[str, ...] = LAYERS) -> dict[str, str]:
    """Apply every layer to this (single-threaded, freshly forked) process or raise ConfinementError.
    `layers` leaves some out: only for finding which layer breaks something (sandbox/judge/cuda_check.py)."""
    machine = os.uname().machine
    if machine not in seccomp_bpf.SYSCALLS:
        raise ConfinementError(f"seccomp: no syscall table for {machine} (x86_64 and aarch64 only)")
    scratch = Path(policy.scratch)
    if not scratch.is_absolute() or not scratch.is_dir():
        raise ConfinementError(f"scratch must be an existing absolute directory: {scratch}")
    for exe in policy.allow_exec:
        if not os.path.isabs(exe) or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
            raise ConfinementError(f"allow_exec entries must be absolute paths of executable files: {exe}")
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise ConfinementError(f"confine() must run in a single-threaded process (right after fork): {threads} threads")
    parent = os.getppid()
    die_with_parent(parent)
    harden_current_process()
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")
    facts = {}
    if "namespaces" in layers:
        facts["namespaces"] = _enter_namespaces(policy.network)
    if "landlock" in layers:
        facts["landlock"] = _landlock(Policy(scratch, policy.allow_exec, policy.network))
    if "capabilities" in layers:
        _drop_capabilities()
        facts["capabilities"] = "none (root only inside its own user namespace)" if os.getuid() == 0 else "none"
    if parent_death_signal() != signal.SIGKILL:  # a credential change clears it: arm it again, before seccomp
        die_with_parent(parent)
    if "seccomp" in layers:
        facts["seccomp"] = _seccomp(policy, machine)
    armed = parent_death_signal()
    facts["parent_death"] = signal.Signals(armed).name if armed else "none"
    facts["dumpable"] = str(_prctl(PR_GET_DUMPABLE))
    facts["no_new_privs"] = str(_prctl(PR_GET_NO_NEW_PRIVS))
    return facts


def run_confined(work: Callable[[Path], None], layers: tuple[str, ...] = LAYERS,
                 timeout_s: float | None = None) -> str | None:
    """Fork a child that confines itself (`layers` of confine(), in a fresh scratch directory) and runs
    `work(scratch)`; None when it returned, else why not, whole on one line (a ConfinementError's own text,
    else the exception's type and text). Confines the child, never the caller; a child still running
    after `timeout_s` is killed."""
    scratch = Path(tempfile.mkdtemp(prefix="kernelloop-confined-"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = ""
        try:
            os.close(read)
            confine(Policy(scratch), layers)
            work(scratch)
        except BaseException as exc:  # noqa: BLE001  (report anything, never return into the caller's code)
            text = " ".join(str(exc).split())
            name = type(exc).__name__
            message = text if isinstance(exc, ConfinementError) else (f"{name}: {text}" if text else name)
        finally:
            os.write(write, message.encode()[:8000])
            os._exit(0)
    os.close(write)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if deadline is not None and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"the confined child did not finish within {timeout_s:g} s"
            time.sleep(0.02)
        with os.fdopen(read, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        if not message and os.waitstatus_to_exitcode(done[1]) != 0:
            message = f"the confined child died (exit status {os.waitstatus_to_exitcode(done[1])})"
        return message or None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def probe() -> str | None:
    """None if confine() works here, else the one-line reason. Confines a throwaway child, not the caller."""
    if os.uname().machine not in seccomp_bpf.SYSCALLS:
        return f"seccomp: no syscall table for {os.uname().machine} (x86_64 and aarch64 only)"

    def writes_only_inside(scratch: Path) -> None:
        (scratch / "inside").write_text("ok")
        try:
            os.mkdir(str(scratch) + "-outside")
        except PermissionError:
            return
        os.rmdir(str(scratch) + "-outside")
        raise ConfinementError("landlock: a directory outside scratch could still be created")

    return run_confined(writes_only_inside)
