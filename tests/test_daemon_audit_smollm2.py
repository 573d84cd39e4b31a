"""Done-when of the shadow audit: `agent daemon` against `engine serve --model smollm2` (both real CLIs, as
subprocesses) audits live traffic, and a regression committed to the registry behind the gate's back, once the
engine reloads it, is rolled back by the audit within its window. Tuning is off (`--audit-only`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kernelloop.engine.errors import ModelLoadError
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

from tests.test_audit_rollback import BROKEN, CLEAN, commit

WINDOW = 6
PROMPTS = ["What is the capital of France?", "Name a colour.", "Count to five.", "Say hello.",
           "What is 2 plus 2?", "Name an animal.", "Name a fruit.", "What day comes after Monday?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(module: str, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=env, cwd=Path(__file__).parent.parent)


def wait_for(check, seconds: float, what: str, logs: list[Path]) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in logs)
    pytest.fail(f"{what} did not happen within {seconds:.0f} s\n{tails}")


def rollback_events(history_path: Path) -> list[dict]:
    with History(history_path) as history:
        return [e for e in history.registry_events() if e["kind"] == "rollback"]


@pytest.mark.slow
def test_the_daemon_rolls_back_a_regression_committed_behind_the_gate(tmp_path) -> None:
    from kernelloop.engine.model_source import resolve_model_dir

    try:
        resolve_model_dir("smollm2")  # fetched and converted once into the cache
    except ModelLoadError as exc:
        pytest.skip(f"smollm2 is not available here: {exc}")
    reg = Registry(tmp_path / "registry")
    commit(reg, CLEAN, 1.1)
    port, history_path = free_port(), tmp_path / "history.db"
    url = f"http://127.0.0.1:{port}"
    logs = [tmp_path / "engine.log", tmp_path / "daemon.log"]
    engine = cli("kernelloop.engine.cli", "serve", "--model", "smollm2", "--device", "cpu", "--kernels", "registry",
                 "--registry", str(reg.path), "--fallback", "reference", "--audit-rate", "1", "--port", str(port),
                 log=logs[0])
    daemon = None
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 120, "engine start", logs)
        daemon = cli("kernelloop.agent.cli", "daemon", "--engine", url, "--audit-only", "--audit-every", "1",
                     "--audit-window", str(WINDOW), "--registry", str(reg.path), "--history", str(history_path),
                     "--device", "cpu", "--metrics-port", "-1", log=logs[1])
        planted = commit(reg, BROKEN, 1.5)  # no gate: straight into the registry
        httpx.post(f"{url}/kernels/reload", timeout=60).raise_for_status()
        for prompt in PROMPTS:
            body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                    "temperature": 0}
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
        wait_for(lambda: reg.head() != planted, 150, "the audit's rollback", logs)
        wait_for(lambda: rollback_events(history_path), 30, "the rollback's history record", logs)
        with History(history_path) as history:
            audited = history.audit_samples(planted)
        event = rollback_events(history_path)[0]
        assert event["detail"]["audited_commit"] == planted and "agreement" in event["detail"]["reason"]
        assert 5 <= len(audited) <= len(PROMPTS)  # judged within its window of the planted commit's requests
        assert reg.entries()[0].sha256 == reg.entries(f"{planted}~1")[0].sha256
        wait_for(lambda: "kernelloop_audit_rollbacks_total 1" in httpx.get(f"{url}/metrics", timeout=10).text, 30,
                 "the engine's audit metrics", logs)
    finally:
        for proc in (daemon, engine):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
        for proc in (daemon, engine):
            if proc is not None:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert daemon.returncode == 0
