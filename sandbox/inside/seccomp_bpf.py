"""A hand-assembled classic-BPF seccomp filter for the candidate's process (no libseccomp).

`build(...)` returns the filter program as bytes (an array of `struct sock_filter`) for the machine
it runs on; `sandbox.inside.confine` installs it. The filter:
- kills the process on a foreign syscall ABI (i386 `int 0x80` on x86_64, arm32 on aarch64) and
  refuses x32 syscall numbers, so no second syscall table slips past the checks below;
- refuses (EPERM) the syscalls in `ALWAYS_DENIED` (debugging other processes, namespaces, mounts,
  kernel keys and modules, BPF, perf, io_uring, device nodes and FIFOs, ...);
- lets signals reach only the process itself (kill / tkill / tgkill / rt_*sigqueueinfo with its own
  pid; kill to its own process group only when that group is safe: see `build`);
- allows `clone` for threads only, plus the vfork style (CLONE_VM|CLONE_VFORK, not CLONE_PARENT)
  when spawning is allowed; never with a namespace flag. `fork` is refused; `vfork` only when spawning is allowed;
  `clone3` says ENOSYS so that libc falls back to `clone`, whose flags the filter can read;
- keeps scheduling and resource-limit changes to the process itself (prlimit64, setpriority,
  sched_set*, ioprio_set), refuses re-enabling dumpable or clearing the parent-death signal
  (prctl), terminal input injection (TIOCSTI, TIOCLINUX), `personality` changes, and optionally
  sockets and `setsid`.
Everything else is allowed. Only little-endian 64-bit arches are supported (args' low words).
"""

from __future__ import annotations

import errno
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

_GENERIC = dict(  # asm-generic numbers (aarch64); no fork, vfork, mknod, iopl, ioperm there
    socket=198, socketpair=199, ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272,
    pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424, mount=40, umount2=39, pivot_root=41, chroot=51,
    unshare=97, setns=268, bpf=280, perf_event_open=241, keyctl=219, add_key=217, request_key=218,
    userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, mknodat=33,
    kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, reboot=142,
    swapon=224, swapoff=225, acct=89, quotactl=60, quotactl_fd=443, personality=92, kill=129, tkill=130,
    tgkill=131, rt_sigqueueinfo=138, rt_tgsigqueueinfo=240, clone=220, clone3=435, prlimit64=261,
    setpriority=140, sched_setaffinity=122, sched_setscheduler=119, sched_setparam=118, sched_setattr=274,
    ioprio_set=30, ioctl=29, prctl=167, setsid=157, open_by_handle_at=265, fsopen=430, fsconfig=431,
    fsmount=432, fspick=433, move_mount=429, open_tree=428, mount_setattr=442, syslog=116, vhangup=58,
    msgget=186, msgctl=187, msgrcv=188, msgsnd=189, semget=190, semctl=191, semtimedop=192, semop=193,
    shmget=194, shmctl=195, shmat=196, shmdt=197)
_X86_64 = dict(
    socket=41, socketpair=53, ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312,
    pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424, mount=165, umount2=166, pivot_root=155, chroot=161,
    unshare=272, setns=308, bpf=321, perf_event_open=298, keyctl=250, add_key=248, request_key=249,
    userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, mknodat=259, mknod=133,
    kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, reboot=169,
    swapon=167, swapoff=168, acct=163, quotactl=179, quotactl_fd=443, personality=135, kill=62, tkill=200,
    tgkill=234, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, clone=56, clone3=435, prlimit64=302,
    setpriority=141, sched_setaffinity=203, sched_setscheduler=144, sched_setparam=142, sched_setattr=314,
    ioprio_set=251, ioctl=16, prctl=157, setsid=112, open_by_handle_at=304, fsopen=430, fsconfig=431,
    fsmount=432, fspick=433, move_mount=429, open_tree=428, mount_setattr=442, syslog=103, vhangup=153,
    fork=57, vfork=58, iopl=172, ioperm=173, shmget=29, shmat=30, shmctl=31, semget=64, semop=65, semctl=66,
    shmdt=67, msgget=68, msgsnd=69, msgrcv=70, msgctl=71, semtimedop=220)
SYSCALLS = {"x86_64": _X86_64, "aarch64": _GENERIC}

ALWAYS_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "mknod", "mknodat", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "open_by_handle_at", "syslog", "vhangup", "iopl", "ioperm", "fork",
    # System V IPC outlives the process (the IPC namespace confines it too)
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
    "msgrcv", "msgctl")

CLONE_VM, CLONE_VFORK, CLONE_PARENT, CLONE_THREAD = 0x100, 0x4000, 0x8000, 0x10000
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1

RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_LD_ABS_W, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06

# A rule: None (always refused), ("only", alternatives) or ("except", arg, values). An alternative is a
# list of (arg index, mask, value) tests on the low 32 bits of that argument, (arg & mask) == value;
# "only": allowed if any alternative holds; "except": refused if the argument equals one of values.
Rule = tuple | None
ALL = 0xFFFFFFFF


def _only(arg: int, *values: int) -> Rule:
    return ("only", [[(arg, ALL, v & ALL)] for v in values])


def rules(pid: int, group: int | None, spawn: bool, network: bool, deny_setsid: bool) -> dict[str, Rule]:
    """Syscall name -> rule. `group`: a process group that kill(0) and kill(-group) may target."""
    table: dict[str, Rule] = {name: None for name in ALWAYS_DENIED}
    table["kill"] = _only(0, pid, *(() if group is None else (0, -group)))
    for name in ("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        table[name] = _only(0, pid)  # first argument: the target tid / tgid
    threads = [(0, CLONE_THREAD | CLONE_NAMESPACES, CLONE_THREAD)]
    vforks = [(0, CLONE_VM | CLONE_VFORK | CLONE_PARENT | CLONE_NAMESPACES, CLONE_VM | CLONE_VFORK)]
    table["clone"] = ("only", [threads, vforks] if spawn else [threads])
    if not spawn:
        table["vfork"] = None
    for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr"):
        table[name] = _only(0, 0, pid)
    table["setpriority"] = ("only", [[(0, ALL, PRIO_PROCESS), (1, ALL, who)] for who in (0, pid)])
    table["ioprio_set"] = ("only", [[(0, ALL, IOPRIO_WHO_PROCESS), (1, ALL, who)] for who in (0, pid)])
    table["personality"] = _only(0, 0xFFFFFFFF)  # the query only
    table["prctl"] = ("except", 0, (PR_SET_PDEATHSIG, PR_SET_DUMPABLE))
    table["ioctl"] = ("except", 1, (TIOCSTI, TIOCLINUX))
    if not network:
        table["socket"] = table["socketpair"] = None
    if deny_setsid:
        table["setsid"] = None
    return table


class _Asm:
    """Classic BPF with symbolic forward jumps (resolved in `assemble`)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}
        self._n = 0

    def label(self) -> str:
        self._n += 1
        return f"L{self._n}"

    def here(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def op(self, code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        self.code.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        out = []
        for i, (code, jt, jf, k) in enumerate(self.code):
            offs = [self.labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if not all(0 <= o <= 255 for o in offs):
                raise ValueError(f"seccomp filter: jump out of range at {i}")
            out.append(struct.pack("=HBBI", code, offs[0], offs[1], k))
        return b"".join(out)


def build(machine: str, pid: int, group: int | None, spawn: bool, network: bool, deny_setsid: bool) -> bytes:
    """The filter program for `machine` (os.uname().machine); raises KeyError for an unknown arch."""
    numbers, arch = SYSCALLS[machine], AUDIT_ARCH[machine]
    deny, nosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    a = _Asm()
    arch_ok = a.label()
    a.op(_LD_ABS_W, 4)                       # seccomp_data.arch
    a.op(_JEQ, arch, arch_ok, 0)
    a.op(_RET, RET_KILL_PROCESS)
    a.here(arch_ok)
    a.op(_LD_ABS_W, 0)                       # seccomp_data.nr; A holds it until a matching check
    if machine == "x86_64":
        a.op(_JGE, X32_SYSCALL_BIT, 0, 1)
        a.op(_RET, deny)
    checks = rules(pid, group, spawn, network, deny_setsid)
    checks["clone3"] = ("nosys",)
    for name, rule in checks.items():
        if name not in numbers:
            continue
        skip = a.label()
        a.op(_JEQ, numbers[name], 0, skip)
        if rule is None:
            a.op(_RET, deny)
        elif rule[0] == "nosys":
            a.op(_RET, nosys)
        elif rule[0] == "except":
            _, arg, values = rule
            a.op(_LD_ABS_W, 16 + 8 * arg)
            for value in values:
                a.op(_JEQ, value, 0, 1)
                a.op(_RET, deny)
            a.op(_RET, RET_ALLOW)
        else:
            for alternative in rule[1]:
                nxt = a.label()
                for arg, mask, value in alternative:
                    a.op(_LD_ABS_W, 16 + 8 * arg)  # low word of the argument (little-endian)
                    if mask != ALL:
                        a.op(_AND, mask)
                    a.op(_JEQ, value, 0, nxt)
                a.op(_RET, RET_ALLOW)
                a.here(nxt)
            a.op(_RET, deny)
        a.here(skip)
    a.op(_RET, RET_ALLOW)
    return a.assemble()


def build_no_clone(machine: str) -> bytes:
    """A second filter, stacked later: no clone at all (no new threads or processes from here on)."""
    numbers, arch = SYSCALLS[machine], AUDIT_ARCH[machine]
    a = _Asm()
    arch_ok = a.label()
    a.op(_LD_ABS_W, 4)
    a.op(_JEQ, arch, arch_ok, 0)
    a.op(_RET, RET_KILL_PROCESS)
    a.here(arch_ok)
    a.op(_LD_ABS_W, 0)
    for name, code in (("clone", errno.EPERM), ("clone3", errno.ENOSYS), ("vfork", errno.EPERM)):
        if name in numbers:
            a.op(_JEQ, numbers[name], 0, 1)
            a.op(_RET, RET_ERRNO | code)
    a.op(_RET, RET_ALLOW)
    return a.assemble()
