"""The sandbox's processes when the judge dies or is interrupted.

- kill -9 of the judging process mid-judgement: within 2 s no process it started is left (fork
  servers, their children, the fresh-interpreter launcher and its child, the compile fork server).
- Ctrl-C (SIGINT to the judge's whole process group, as a terminal sends it): one line
  "interrupted", exit 130, no traceback from any sandbox process, nothing left behind.
- a fork server started from a thread that then ends keeps serving (PR_SET_PDEATHSIG follows the
  parent *thread*).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelloop.kernels.device import CPU
from kernelloop.sandbox.judge.forkserver import ForkServer

REPO = Path(__file__).resolve().parents[1]
SPIN = REPO / "tests" / "sandbox_candidates" / "infinite_loop.py"  # rmsnorm, spins inside forward


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (depth below root, start time)} of every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[0] not in "ZX":
            children.setdefault(st[1], []).append(int(entry))
            starts[int(entry)] = st[2]
    found, frontier, depth = {}, [root], 0
    while frontier:
        depth += 1
        frontier = [c for p in frontier for c in children.get(p, [])]
        found.update({c: (depth, starts[c]) for c in frontier})
    return found


def alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in "ZX" and st[2] == start


def agent_check(*extra: str, new_session: bool = False) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "TRITON_INTERPRET": "1"}
    # As a shell starts a foreground command: SIGINT at its default. An ignored SIGINT is inherited
    # across exec (and Python then installs no KeyboardInterrupt handler), so a disposition left by an
    # earlier test in this process would make the Ctrl-C test hang for reasons of its own.
    return subprocess.Popen([sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm", str(SPIN), "--device", "cpu",
                             "--json", "--no-history", "--timeout", "150", *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until_spinning(proc: subprocess.Popen, depth: int = 2) -> dict[int, tuple[int, int]]:
    """Wait until a sandboxed process (`depth` below the judge) has been running for a second."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        tree = descendants(proc.pid)
        if any(d >= depth for d, _ in tree.values()):
            time.sleep(1.0)
            return descendants(proc.pid)
        time.sleep(0.1)
    proc.kill()
    pytest.fail("no sandboxed process started within 120 s")


def assert_all_gone(tree: dict[int, tuple[int, int]], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [pid for pid, (_, start) in tree.items() if alive(pid, start)]
        if not left:
            return
        time.sleep(0.05)
    for pid in left:  # do not leave them spinning on a shared machine
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pytest.fail(f"{len(left)} sandbox process(es) outlived the judge by {within} s: {left}")


@pytest.mark.parametrize("extra", [("--compile-for", "sm90"), ("--unconfined",), ("--fresh-interpreter",)],
                         ids=["confined+compile-server", "unconfined", "fresh-interpreter"])
def test_kill_9_of_the_judge_leaves_no_sandbox_process(extra: tuple[str, ...]) -> None:
    proc = agent_check(*extra)
    tree = wait_until_spinning(proc)
    servers = [pid for pid, (depth, _) in tree.items() if depth == 1]
    assert servers and len(tree) > len(servers), tree  # a server (or launcher) and its sandboxed child(ren)
    if "--compile-for" in extra:
        assert len(servers) >= 2, tree  # the compile fork server runs beside the sandbox's
    proc.kill()
    proc.wait()
    assert_all_gone(tree, within=2.0)


def test_ctrl_c_is_one_line_exit_130_and_leaves_nothing() -> None:
    proc = agent_check(new_session=True)
    tree = wait_until_spinning(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "agent check: interrupted"
    assert_all_gone(tree, within=2.0)


def test_a_fork_server_started_by_a_thread_that_ends_keeps_serving() -> None:
    server = ForkServer(CPU)
    try:
        started = threading.Thread(target=server._ensure)
        started.start()
        started.join()
        time.sleep(1.0)  # PDEATHSIG, had it followed the thread, would have killed it by now
        assert server._proc.poll() is None
        reply = server._request({"op": "wait", "pid": 999_999_999}, timeout=60)
        assert reply is not None and reply["status"] is None  # it still answers (that is no child of its)
    finally:
        server.close()


def test_a_request_interrupted_by_ctrl_c_drops_the_fork_server(monkeypatch) -> None:
    # A Ctrl-C that lands while the judge reads a fork-server reply can leave the stream mid-frame; a
    # later request would then read garbage and wait out its timeout. The server is dropped instead, and
    # waiting on its children answers at once (they died with it).
    from kernelloop.sandbox.judge import forkserver as fs

    server = ForkServer(CPU)
    try:
        proc = server._ensure() and server._proc

        def interrupted(sock):
            raise KeyboardInterrupt

        monkeypatch.setattr(fs, "_recv_msg", interrupted)
        with pytest.raises(KeyboardInterrupt):
            server.wait(999_999_999, 60)
        monkeypatch.undo()
        assert proc.poll() is not None and server._proc is None  # killed, not reused
        start = time.monotonic()
        assert server.wait(999_999_999, 30) is None and time.monotonic() - start < 1.0
    finally:
        server.close()
