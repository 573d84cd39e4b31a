"""sandbox.confine: the kernel's confinement of a candidate's process, attacked from inside.

Every probe runs in a child forked by one helper process per module (a fresh interpreter that has
imported torch and triton but never entered an OpenMP region, and made itself non-dumpable, like the
fork server): the child confines itself, runs the probe and reports over a pipe. Nothing needs a GPU:
the key test compiles a Triton kernel to a cubin with the bundled ptxas inside the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import triton.language as tl

from sandbox import seccomp_bpf
from sandbox.confine import ConfinementError, Policy, confine, harden_current_process, probe

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 60


def _try(fn, *args, **kwargs) -> list:
    """["ok", value] or ["error", exception type, errno]: what a probe reports for one attempt."""
    try:
        value = fn(*args, **kwargs)
        return ["ok", value if isinstance(value, (int, str, float, bool, type(None))) else repr(value)[:200]]
    except BaseException as exc:  # noqa: BLE001
        return ["error", type(exc).__name__, getattr(exc, "errno", None)]


def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # made a (JIT or interpreted) kernel in probes
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


# ---- probes: run in the confined child; `scratch` is the policy's scratch, `arg` the test's argument ----

def probe_writes(scratch: Path, arg, state) -> dict:
    import torch

    outside = Path(arg)
    return {
        "open_outside": _try(lambda: open(outside / "x", "w")),
        "mkdir_outside": _try(os.mkdir, outside / "d"),
        "torch_save_outside": _try(torch.save, torch.ones(3), str(outside / "x.pt")),
        "write_inside": _try(lambda: (scratch / "a.txt").write_text("hello")),
        "mkdir_rename_remove_inside": _try(lambda: (os.mkdir(scratch / "d"), os.rename(scratch / "a.txt",
                                           scratch / "d" / "b.txt"), os.remove(scratch / "d" / "b.txt"),
                                           os.rmdir(scratch / "d"))),
        "torch_save_inside": _try(lambda: (torch.save(torch.ones(3), str(scratch / "t.pt")),
                                           torch.load(str(scratch / "t.pt")).sum().item())[1]),
        "dev_null": _try(lambda: open("/dev/null", "w").write("x")),
        "read_etc": _try(lambda: len(Path("/etc/hostname").read_bytes()) >= 0),
    }


def probe_special_files(scratch: Path, arg, state) -> dict:
    return {
        "mkfifo": _try(os.mkfifo, scratch / "fifo"),
        "mknod_regular": _try(os.mknod, scratch / "node"),
        "mknod_char": _try(os.mknod, scratch / "null", 0o600 | 0o020000, os.makedev(1, 3)),
        "symlink": _try(os.symlink, "/etc/passwd", scratch / "link"),
        "unix_socket_file": _try(lambda: socket.socket(socket.AF_UNIX).bind(str(scratch / "sock"))),
    }


def prepare_tcp_socket(scratch: Path, arg):
    """Before confine: a TCP socket made while sockets were still allowed."""
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def probe_network(scratch: Path, arg, state) -> dict:
    def connect_new():
        with socket.create_connection(("127.0.0.1", arg), timeout=5) as s:
            return s.recv(5).decode()

    def connect_old():
        state.settimeout(5)
        state.connect(("127.0.0.1", arg))
        return state.recv(5).decode()

    return {"socket": _try(socket.socket), "unix_socket": _try(socket.socket, socket.AF_UNIX),
            "socketpair": _try(socket.socketpair), "connect_new": _try(connect_new),
            "connect_premade_socket": _try(connect_old)}


def probe_processes(scratch: Path, arg, state) -> dict:
    ptxas = arg
    result = {
        "fork": _try(os.fork),
        "subprocess_true": _try(lambda: subprocess.run(["/bin/true"]).returncode),
        "subprocess_sh": _try(lambda: subprocess.run(["/bin/sh", "-c", "true"]).returncode),
        "posix_spawn_true": _try(lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)[1]),
        "execv_sh_in_place": _try(os.execv, "/bin/sh", ["sh", "-c", "exit 0"]),
    }
    if ptxas:
        result["ptxas_version"] = _try(lambda: subprocess.run([ptxas, "--version"], capture_output=True,
                                                              check=True).stdout.decode())
        result["ptxas_posix_spawn"] = _try(lambda: os.waitpid(os.posix_spawn(
            ptxas, [ptxas, "--version"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)]),
            0)[1])
    return result


def probe_signals(scratch: Path, arg, state) -> dict:
    parent = os.getppid()
    got = []
    signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    result = {"kill_parent_0": _try(os.kill, parent, 0), "kill_parent_term": _try(os.kill, parent, signal.SIGTERM),
              "kill_all": _try(os.kill, -1, 0), "kill_self_0": _try(os.kill, os.getpid(), 0),
              "raise_self": _try(os.kill, os.getpid(), signal.SIGUSR1)}
    result["handler_ran"] = bool(got)
    libc = ctypes.CDLL(None, use_errno=True)
    result["ptrace_attach_parent"] = [libc.ptrace(16, parent, 0, 0), ctypes.get_errno()]
    result["parent_environ"] = _try(lambda: Path(f"/proc/{parent}/environ").read_bytes()[:20])
    result["parent_mem"] = _try(lambda: open(f"/proc/{parent}/mem", "rb"))
    result["own_environ"] = _try(lambda: len(Path("/proc/self/environ").read_bytes()) > 0)
    result["prlimit_parent"] = _try(lambda: __import__("resource").prlimit(parent, 7, (64, 64)))
    result["setpriority_parent"] = _try(os.setpriority, os.PRIO_PROCESS, parent, 19)
    result["undo_pdeathsig"] = [libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno()]
    result["sysv_shmget"] = [libc.shmget(0x6B6C6F70, 4096, 0o1600), ctypes.get_errno()]  # IPC_CREAT | 0600
    result["sysv_msgget"] = [libc.msgget(0x6B6C6F70, 0o1600), ctypes.get_errno()]
    return result


def probe_no_new_threads(scratch: Path, arg, state) -> dict:
    from sandbox.confine import forbid_new_threads

    before = _try(lambda: threading.Thread(target=lambda: None).start())
    forbid_new_threads()
    return {"before": before, "after": _try(lambda: threading.Thread(target=lambda: None).start()),
            "fork": _try(os.fork)}


def probe_grandchild(scratch: Path, arg, state) -> dict:
    """Unconfined intermediate: fork a confined grandchild, wait until it is confined, then exit."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            confine(Policy(scratch))
        except BaseException as exc:  # noqa: BLE001
            os.write(write, repr(exc).encode())
            os._exit(1)
        os.write(write, b"confined")
        time.sleep(CHILD_TIMEOUT_S)
        os._exit(0)
    ready, _, _ = select.select([read], [], [], 20)
    return {"grandchild": pid, "ready": os.read(read, 20).decode() if ready else ""}


def probe_torch(scratch: Path, arg, state) -> dict:
    import torch

    torch.set_num_threads(2)
    a = torch.randn(128, 128, generator=torch.Generator().manual_seed(0))
    out = {"matmul": float((a @ a.T).trace()), "expected": float((a * a).sum()), "threads": torch.get_num_threads(),
           "empty": list(torch.empty(4, 5).shape)}
    box = []
    t = threading.Thread(target=lambda: box.append(float(torch.ones(1000).sum())))
    t.start()
    t.join()
    out["python_thread"] = box
    return out


def probe_triton_interpreter(scratch: Path, arg, state) -> dict:
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton-cache")
    import torch
    import triton

    kernel = triton.jit(_add_kernel)
    x, y = torch.arange(100, dtype=torch.float32), torch.ones(100)
    out = torch.empty_like(x)
    kernel[(triton.cdiv(100, 32),)](x, y, out, 100, BLOCK=32)
    return {"ok": bool(torch.equal(out, x + y)), "kind": type(kernel).__name__}


def probe_compile_cubin(scratch: Path, arg, state) -> dict:
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton-cache")
    os.environ["TMPDIR"] = str(scratch / "tmp")
    os.makedirs(scratch / "tmp")
    tempfile.tempdir = str(scratch / "tmp")
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills (no driver to load the cubin here)
    fn = triton.runtime.jit.JITFunction(_add_kernel)
    src = triton.compiler.ASTSource(fn=fn, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                                      "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024})
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    cubin = compiled.asm["cubin"]
    regs = re.search(r"Used (\d+) registers", log.getvalue())
    spills = re.search(r"(\d+) bytes spill stores", log.getvalue())
    return {"cubin_type": type(cubin).__name__, "cubin_len": len(cubin), "elf": cubin[:4] == b"\x7fELF",
            "name": compiled.metadata.name, "shared": compiled.metadata.shared,
            "n_regs": int(regs.group(1)) if regs else None, "n_spills": int(spills.group(1)) if spills else None,
            "sh": _try(lambda: subprocess.run(["/bin/sh", "-c", "true"]).returncode),
            "tmp_left_in_scratch": sorted(os.listdir(scratch / "tmp"))}


PROBES = {name: fn for name, fn in globals().items() if name.startswith("probe_")}


# ---- the helper process (a fresh interpreter) ----

def _run_child(request: dict) -> dict:
    scratch = Path(request["scratch"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            prepare = globals()[request["prepare"]] if request.get("prepare") else None
            state = prepare(scratch, request.get("arg")) if prepare else None
            facts = {}
            if request["policy"] is not None:
                p = request["policy"]
                start = time.perf_counter()
                facts = confine(Policy(scratch, tuple(p.get("allow_exec", ())), p.get("network", False)))
                facts["confine_ms"] = f"{(time.perf_counter() - start) * 1e3:.1f}"
            payload = {"facts": facts, "result": PROBES[request["probe"]](scratch, request.get("arg"), state)}
        except BaseException as exc:  # noqa: BLE001
            payload = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(payload).encode())
        os._exit(0)
    os.close(write)
    data, deadline = b"", time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(read, 1 << 16) if ready else b""
        if not chunk:
            break
        data += chunk
    os.close(read)
    with contextlib.suppress(ProcessLookupError):
        if not data:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    payload = json.loads(data) if data else {"error": "no report"}
    payload["exit"] = os.waitstatus_to_exitcode(status)
    return payload


def _serve() -> None:
    """The helper's main loop: one JSON request per line on stdin, one JSON reply per line."""
    import torch  # noqa: F401  (preloaded like the fork server; no OpenMP region entered)
    import triton  # noqa: F401

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a child prints goes to stderr, not into the replies
    harden_current_process()
    libc = ctypes.CDLL(None)
    replies.write(json.dumps({"pid": os.getpid(), "dumpable": libc.prctl(3, 0, 0, 0, 0)}) + "\n")
    replies.flush()
    for line in sys.stdin:
        replies.write(json.dumps(_run_child(json.loads(line))) + "\n")
        replies.flush()
    os._exit(0)  # skip torch's slow interpreter teardown


class Helper:
    def __init__(self) -> None:
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(PROJECT_ROOT), SECRET_TOKEN="hunter2")
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.test_sandbox_confine import _serve; _serve()"],
                                     cwd=PROJECT_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.hello = json.loads(self.proc.stdout.readline())

    def run(self, probe_name: str, scratch: Path, policy: dict | None = None, arg=None, prepare: str | None = None):
        """Run a probe in a fresh child confined by `policy` (None: not confined); its result and facts."""
        request = {"probe": probe_name, "scratch": str(scratch), "policy": policy, "arg": arg, "prepare": prepare}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert "error" not in reply, reply
        assert reply["exit"] == 0, reply
        return reply["result"], reply["facts"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def helper():
    h = Helper()
    yield h
    h.close()


@pytest.fixture(scope="module")
def ptxas() -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path


def _refused(outcome: list) -> bool:
    return outcome[0] == "error"


# ---- tests ----

def test_probe_says_confinement_works_here():
    assert probe() is None


def test_confine_refuses_bad_policies_and_threads(tmp_path):
    # Checked before anything is applied, so the test process stays unconfined.
    with pytest.raises(ConfinementError, match="absolute directory"):
        confine(Policy(tmp_path / "missing"))
    with pytest.raises(ConfinementError, match="allow_exec"):
        confine(Policy(tmp_path, allow_exec=("ptxas",)))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with pytest.raises(ConfinementError, match="single-threaded"):
            confine(Policy(tmp_path))
    finally:
        stop.set()
        t.join()


def test_facts_and_helper_hardening(helper, tmp_path):
    assert helper.hello["dumpable"] == 0
    _, facts = helper.run("probe_special_files", tmp_path, {})
    assert facts["namespaces"] == "user+ipc+net"
    assert facts["landlock"].startswith("abi ") and "exec: none" in facts["landlock"]
    assert facts["parent_death"] == "SIGKILL" and facts["dumpable"] == "0" and facts["no_new_privs"] == "1"
    assert "signals to self only" in facts["seccomp"]
    assert float(facts["confine_ms"]) < 1000


def test_writes_only_inside_scratch(helper, tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    result, _ = helper.run("probe_writes", scratch, {}, arg=str(outside))
    for key in ("open_outside", "mkdir_outside", "torch_save_outside"):
        assert _refused(result[key]), (key, result[key])
    assert list(outside.iterdir()) == []
    for key in ("write_inside", "mkdir_rename_remove_inside", "dev_null", "read_etc"):
        assert result[key][0] == "ok", (key, result[key])
    assert result["torch_save_inside"] == ["ok", 3.0]


def test_no_fifos_device_nodes_symlinks_or_socket_files(helper, tmp_path):
    result, _ = helper.run("probe_special_files", tmp_path, {})
    for key, outcome in result.items():
        assert _refused(outcome), (key, outcome)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("network", [False, True])
def test_network(helper, tmp_path, network):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        stop = threading.Event()

        def accept():
            server.settimeout(0.2)
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    conn.sendall(b"hello")
                    conn.close()

        t = threading.Thread(target=accept)
        t.start()
        try:
            result, facts = helper.run("probe_network", tmp_path, {"network": network}, arg=port,
                                       prepare="prepare_tcp_socket")
        finally:
            stop.set()
            t.join()
    if network:  # the control: the same probe reaches the port when the policy allows networking
        assert facts["namespaces"] == "user+ipc"
        assert result["connect_new"] == ["ok", "hello"] and result["connect_premade_socket"] == ["ok", "hello"]
    else:
        assert all(_refused(outcome) for outcome in result.values()), result
        assert result["socket"][2] == 1  # EPERM from seccomp
        assert result["connect_premade_socket"][2] in (13, 101)  # Landlock EACCES (or no route in the netns)


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


def test_torch_after_confinement(helper, tmp_path):
    result, _ = helper.run("probe_torch", tmp_path, {})
    assert result["matmul"] == pytest.approx(result["expected"], rel=1e-4)
    assert result["threads"] == 2 and result["empty"] == [4, 5] and result["python_thread"] == [1000.0]


def test_triton_interpreter_after_confinement(helper, tmp_path):
    result, _ = helper.run("probe_triton_interpreter", tmp_path, {})
    assert result == {"ok": True, "kind": "InterpretedFunction"}


def test_compile_cubin_for_a_gpu_inside_the_sandbox(helper, tmp_path, ptxas):
    """The key test: Triton's full CUDA pipeline (MLIR, LLVM, the bundled ptxas) on a CPU machine, confined."""
    result, facts = helper.run("probe_compile_cubin", tmp_path, {"allow_exec": [ptxas]})
    assert result["cubin_type"] == "bytes" and result["cubin_len"] > 1000 and result["elf"], result
    assert result["name"] == "_add_kernel" and isinstance(result["shared"], int)
    assert result["n_regs"] and result["n_regs"] > 0 and result["n_spills"] == 0, result
    assert _refused(result["sh"]), result["sh"]
    assert result["tmp_left_in_scratch"] == []
    assert any((tmp_path / "triton-cache").rglob("*.cubin"))
    print(f"cubin {result['cubin_len']} bytes, {result['n_regs']} registers, {result['n_spills']} spills, "
          f"shared {result['shared']}; confine {facts['confine_ms']} ms")


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
        run = lambda name, *args: _run_filter(prog, arch, nr[name], *args)  # noqa: E731
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
