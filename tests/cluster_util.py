"""Loopback Ray clusters for tests: started by the test, torn down by it, never anyone else's.

    with one_node(tmp_path) as address: ...    # ray.init in this process (num_cpus=2), 127.0.0.1
    with two_nodes(tmp_path) as address: ...   # `ray start --head` + `ray start --address`, two
                                               # "nodes" on this machine, each its own processes

Every Ray process runs on 127.0.0.1 with the dashboard off, and keeps its files under its own temp
dir in `tmp_path`. Teardown kills only the processes these helpers started (a `ray start --block`
tears down its node on SIGTERM; what is left below it is killed by PID), never a bare `ray stop`.
Ray turns a node address of 127.0.0.1 into the machine's routable one: tests/ray_loopback.py keeps
it on loopback, in this process (`keep_loopback`) and in the `ray start` processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 90


@contextlib.contextmanager
def _short_dir() -> Iterator[Path]:
    """A temp dir with a short path: Ray's socket paths under it must fit AF_UNIX's 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="klray-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_env() -> dict[str, str]:
    # Token authentication, as `ray start` sets up by default (the token in ~/.ray/auth_token):
    # every process of the test's cluster, and the probe, use it.
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    env.setdefault("TRITON_INTERPRET", "1")
    return env


def _descendants(root: int) -> set[int]:
    from tests.test_sandbox_faults import descendants

    return set(descendants(root))


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM a `ray start --block` (it stops its node), then SIGKILL whatever is left below it."""
    below = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def one_node(tmp_path: Path, num_cpus: int = 2) -> Iterator[str]:
    """ray.init in this process: a one-node cluster on 127.0.0.1; yields its address ('auto' finds it)."""
    from tests.ray_loopback import keep_loopback

    keep_loopback()
    import ray

    with _short_dir() as temp:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=str(temp),
                 log_to_driver=False, configure_logging=False)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


def _start(args: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.ray_loopback", "start", "--block", "--node-ip-address", "127.0.0.1",
           "--disable-usage-stats", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=_ray_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_for_nodes(address: str, count: int, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """Until `count` nodes are alive (asked through a short-lived `ray` client in a subprocess)."""
    probe = ("import sys, ray\nfrom tests.ray_loopback import keep_loopback\nkeep_loopback()\n"
             f"ray.init(address={address!r}, log_to_driver=False, configure_logging=False)\n"
             "print(sum(1 for n in ray.nodes() if n['Alive']))\nray.shutdown()\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs):
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=_ray_env(), capture_output=True,
                                 text=True, timeout=30)
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the test's Ray cluster at {address} did not reach {count} nodes in {START_TIMEOUT_S} s")


@contextlib.contextmanager
def two_nodes(tmp_path: Path, cpus_each: int = 1) -> Iterator[str]:
    """A head (`ray start --head`) and a second node process (`ray start --address`), both on
    127.0.0.1 with their own temp dirs; yields the head's 'host:port'. The caller connects
    (ray.init(address=...) after keep_loopback(), or JudgePool(address, ...))."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    logs = [tmp_path / "ray-head.log", tmp_path / "ray-node2.log"]
    with contextlib.ExitStack() as stack:
        temp = stack.enter_context(_short_dir())
        stack.callback(lambda: [_kill_tree(proc) for proc in reversed(procs)])
        procs.append(_start(["--head", "--port", str(port), "--include-dashboard=false",
                             "--num-cpus", str(cpus_each), "--temp-dir", str(temp)], logs[0]))
        _wait_for_nodes(address, 1, procs, logs[:1])
        procs.append(_start(["--address", address, "--num-cpus", str(cpus_each)], logs[1]))
        _wait_for_nodes(address, 2, procs, logs)
        yield address
