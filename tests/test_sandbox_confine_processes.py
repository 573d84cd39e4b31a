"""sandbox.inside.confine: processes, signals and threads of a confined candidate, and the seccomp filter.

No new processes unless allow_exec names the program, no signals, ptrace or /proc of other processes,
no threads once forbidden, death with the parent; and the BPF filter's verdicts, interpreted for both
syscall tables. Probes run in a confined child of tests/confine_harness.py's helper process.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path

import pytest

from kernelloop.sandbox.inside import seccomp_bpf

from tests.confine_harness import _refused


def test_no_processes_without_allow_exec(helper, tmp_path):
    result, _ = helper.run("probe_processes", tmp_path, {}, arg=None)
    for key, outcome in result.items():
        assert _refused(outcome), (key, outcome)


def test_allow_exec_runs_only_that_program(helper, tmp_path, ptxas):
    result, facts = helper.run("probe_processes", tmp_path, {"allow_exec": [ptxas]}, arg=ptxas)
    assert result["ptxas_version"][0] == "ok" and "Cuda compilation tools" in result["ptxas_version"][1]
    assert result["ptxas_posix_spawn"] == ["ok", 0]
    for key in ("fork", "subprocess_true", "subprocess_sh", "posix_spawn_true", "execv_sh_in_place"):
        assert _refused(result[key]), (key, result[key])
    assert os.path.basename(ptxas) in facts["landlock"]


def test_signals_ptrace_and_proc_of_other_processes(helper, tmp_path):
    result, _ = helper.run("probe_signals", tmp_path, {})
    for key in ("kill_parent_0", "kill_parent_term", "kill_all", "parent_environ", "parent_mem", "prlimit_parent",
                "setpriority_parent"):
        assert _refused(result[key]), (key, result[key])
    assert result["ptrace_attach_parent"] == [-1, 1]
    assert result["undo_pdeathsig"] == [-1, 1]
    assert result["kill_self_0"][0] == "ok" and result["raise_self"][0] == "ok" and result["handler_ran"]
    assert result["own_environ"] == ["ok", True]
    assert result["sysv_shmget"] == [-1, 1] and result["sysv_msgget"] == [-1, 1]  # EPERM: nothing outlives it
    assert helper.proc.poll() is None  # SIGTERM never reached the helper


def test_threads_can_be_named_by_their_creator_and_nothing_else_in_proc_is_writable(helper, tmp_path):
    # cuInit names its helper threads this way and fails with CUDA error 304 where it cannot
    # (seen on the H200: every sandboxed CUDA process failed in cudaGetDeviceCount).
    result, _ = helper.run("probe_thread_names", tmp_path, {})
    assert result["pthread_setname_np"] == ["ok", 0], result
    assert result["read_back"] == ["ok", "kl-worker"], result
    assert result["comm_by_path"] == ["ok", 8], result
    for key in ("process_comm", "oom_score_adj", "parent_task_comm", "own_task_uid_map"):
        assert _refused(result[key]), (key, result[key])


def test_no_new_threads_once_forbidden(helper, tmp_path):
    result, _ = helper.run("probe_no_new_threads", tmp_path, {})
    assert result["before"][0] == "ok"
    assert _refused(result["after"]) and _refused(result["fork"])


def test_child_dies_with_its_parent(helper, tmp_path):
    result, _ = helper.run("probe_grandchild", tmp_path, None)
    assert result["ready"] == "confined"
    pid, deadline = result["grandchild"], time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the confined grandchild outlived its parent")


def _run_filter(program: bytes, arch: int, nr: int, *args: int) -> int:
    """A classic-BPF interpreter for the few opcodes the filter uses: the filter's verdict for one call."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in (*args, 0, 0, 0, 0, 0, 0)[:6]])
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code in (0x15, 0x35):
            pc += jt if (acc == k if code == 0x15 else acc >= k) else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_filter_decisions(machine):
    """Both syscall tables, without running on that arch: the filter's verdicts, interpreted."""
    nr, arch = seccomp_bpf.SYSCALLS[machine], seccomp_bpf.AUDIT_ARCH[machine]
    allow, eperm = seccomp_bpf.RET_ALLOW, seccomp_bpf.RET_ERRNO | 1
    sigchld, thread_flags = 17, 0x3D0F00  # glibc's pthread_create flags (CLONE_VM|...|CLONE_THREAD|...)
    for spawn in (False, True):
        prog = seccomp_bpf.build(machine, 4242, None, spawn=spawn, network=False, deny_setsid=True)
        run = lambda name, *args: _run_filter(prog, arch, nr[name], *args)  # noqa: E731, B023
        assert _run_filter(prog, 0x40000003, 0) == seccomp_bpf.RET_KILL_PROCESS  # i386 / foreign ABI
        assert _run_filter(prog, arch, 63 if machine == "aarch64" else 0) == allow  # read
        assert run("kill", 4242, 0) == allow and run("kill", 4242 + (1 << 32), 9) == allow  # high bits ignored
        assert run("kill", 1, 9) == eperm and run("kill", 0, 9) == eperm and run("kill", -1, 9) == eperm
        assert run("tgkill", 4242, 4243, 6) == allow and run("tgkill", 99, 99, 6) == eperm
        assert run("clone", thread_flags) == allow and run("clone", thread_flags | 0x40000000) == eperm
        assert run("clone", 0x01200000 | sigchld) == eperm  # fork()
        assert run("clone", 0x4100 | sigchld) == (allow if spawn else eperm)  # posix_spawn / vfork style
        assert run("clone", 0xC100 | sigchld) == eperm  # ... with CLONE_PARENT
        assert run("clone3", 0) == seccomp_bpf.RET_ERRNO | 38
        assert run("socket", 2, 1, 0) == eperm and run("ptrace", 16, 1) == eperm and run("setsid") == eperm
        assert run("prctl", 4, 1) == eperm and run("prctl", 1, 0) == eperm and run("prctl", 15, 0) == allow
        assert run("ioctl", 0, 0x5412) == eperm and run("ioctl", 0, 0x5401) == allow
        assert run("prlimit64", 0, 7) == allow and run("prlimit64", 1, 7) == eperm
        assert run("personality", 0xFFFFFFFF) == allow and run("personality", 0x0040000) == eperm
        if machine == "x86_64":
            assert _run_filter(prog, arch, 0x40000000 | 41) == eperm  # x32 socket
            assert run("fork") == eperm and run("vfork") == (allow if spawn else eperm)
    prog = seccomp_bpf.build(machine, 4242, 4242, spawn=False, network=True, deny_setsid=False)
    run = lambda name, *args: _run_filter(prog, arch, nr[name], *args)  # noqa: E731
    assert run("socket", 2, 1, 0) == allow and run("setsid") == allow
    assert run("kill", 0, 15) == allow and run("kill", -4242, 15) == allow and run("kill", -4243, 15) == eperm
