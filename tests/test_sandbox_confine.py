"""sandbox.inside.confine: the kernel's confinement of a candidate's process, attacked from inside.

Every probe runs in a child forked by one helper process per test session (the `helper` fixture in
conftest.py: a fresh interpreter that has imported torch and triton but never entered an OpenMP
region, and made itself non-dumpable, like the fork server): the child confines itself, runs the probe and reports over a pipe. Nothing needs a GPU:
the key test compiles a Triton kernel to a cubin with the bundled ptxas inside the sandbox.

This file: the probe, policy checks, the facts confine reports, files and the network. Processes,
signals, threads and the seccomp filter are in test_sandbox_confine_processes.py; torch, the Triton
interpreter and compilation after confinement in test_sandbox_confine_workloads.py; the probes and
the helper process in tests/confine_harness.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from kernelloop.sandbox.inside.confine import ConfinementError, Policy, confine, probe

from tests.confine_harness import _refused

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
