"""The confinement tests' harness: probes run in a confined child, forked by a helper process.

`Helper` starts a fresh interpreter that has imported torch and triton but never entered an OpenMP
region, and made itself non-dumpable, like the fork server. For each request it forks a child that
confines itself with the given policy, runs one of the `probe_*` functions below and reports over a
pipe. Used by tests/test_sandbox_confine*.py, one helper per test module.
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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import triton.language as tl

from kernelloop.sandbox.inside.confine import Policy, confine, harden_current_process

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
    from kernelloop.sandbox.inside.confine import forbid_new_threads

    before = _try(lambda: threading.Thread(target=lambda: None).start())
    forbid_new_threads()
    return {"before": before, "after": _try(lambda: threading.Thread(target=lambda: None).start()),
            "fork": _try(os.fork)}


def probe_thread_names(scratch: Path, arg, state) -> dict:
    """What cuInit does for its helper threads: the creator names a new thread through
    /proc/self/task/<tid>/comm (glibc's pthread_setname_np for another thread); other /proc files stay shut."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        def comm(path: str) -> int:
            fd = os.open(path, os.O_RDWR)
            try:
                return os.write(fd, b"kl-named")
            finally:
                os.close(fd)

        named = libc.pthread_setname_np(ctypes.c_ulong(worker.ident), b"kl-worker")
        return {
            "pthread_setname_np": ["ok", 0] if named == 0 else ["error", "OSError", named],
            "read_back": _try(lambda: Path(f"/proc/self/task/{worker.native_id}/comm").read_text().strip()),
            "comm_by_path": _try(comm, f"/proc/self/task/{worker.native_id}/comm"),
            "process_comm": _try(comm, "/proc/self/comm"),
            "oom_score_adj": _try(lambda: Path("/proc/self/oom_score_adj").write_text("500")),
            "parent_task_comm": _try(comm, f"/proc/{os.getppid()}/task/{os.getppid()}/comm"),
            "own_task_uid_map": _try(lambda: Path(f"/proc/self/task/{worker.native_id}/uid_map").write_text("0 0 1")),
        }
    finally:
        stop.set()
        worker.join()


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
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.confine_harness import _serve; _serve()"],
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


def _refused(outcome: list) -> bool:
    return outcome[0] == "error"
