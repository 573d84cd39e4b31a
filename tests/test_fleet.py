"""A fleet of engines: `--engine` repeated tunes several serving engines as one.

profiler/merge.py folds the engines' profiles into one weighted by served tokens; agent/fleet.py
`FleetEngine` profiles every engine, reloads every engine, and measures the gate on the first.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from kernelloop.agent.fleet import FleetEngine
from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.loop.target import choose_target
from kernelloop.common.errors import KernelloopError
from kernelloop.common.profile_contract import Profile
from kernelloop.kernels.registry import Registry
from kernelloop.profiler.merge import merge_profiles
from kernelloop.profiler.profile import assemble

from tests.hf_checkpoints import make_checkpoint
from tests.test_profile_contract import _problems

ROOT = Path(__file__).parents[1]


def _profile(url: str, rmsnorm_s: float, linear_s: float, tokens: int, hidden: int = 64) -> Profile:
    """A profile of `url` as assemble() makes it: two ops, step regions around them, `tokens` generated."""
    ops = rmsnorm_s + linear_s
    raw = {"device": "cpu", "region_timing": "cpu-wall", "op_timing": "cpu-wall",
           "counters": {"generated_tokens": tokens, "prompt_tokens": 40, "cached_prompt_tokens": 10},
           "regions": {"step": {"calls": 4, "seconds": ops + 0.2}, "forward": {"calls": 4, "seconds": ops + 0.1},
                       "sample": {"calls": 4, "seconds": 0.05}, "schedule": {"calls": 4, "seconds": 0.05}},
           "variants": {"rmsnorm": {"float32": "baseline"}},
           "ops": [{"op": "rmsnorm", "dtype": "float32", "shape": {"tokens": 3, "hidden": hidden}, "calls": 10,
                    "seconds": rmsnorm_s},
                   {"op": "linear", "dtype": "float32", "shape": {"tokens": 3, "n": 96, "k": 64}, "calls": 10,
                    "seconds": linear_s}]}
    return assemble(raw, fingerprint="cpu-interpreter", engine=url, model="tiny", kernels="registry", wall_seconds=2.0,
                    requests=2, latencies={"ttft_ms_median": 10.0, "tpot_ms_median": 5.0}, rates=None, notes=["waited"])


A = "http://127.0.0.1:1"
B = "http://127.0.0.1:2"
HOT_NORM = _profile(A, rmsnorm_s=0.6, linear_s=0.2, tokens=10)  # A's hottest op: rmsnorm
HOT_LINEAR = _profile(B, rmsnorm_s=0.1, linear_s=0.9, tokens=10)  # B's: linear


class NoHistory:
    def recent_runs(self, *args: Any) -> list:
        return []


def _row(profile: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in profile["rows"] if r["name"] == name)


def test_merged_profile_keeps_the_contract_and_sums_seconds_by_default() -> None:
    merged = merge_profiles([HOT_NORM, HOT_LINEAR])  # weights: each profile's own tokens (equal here)
    assert not _problems(merged, Profile)
    assert sum(r["share"] for r in merged["rows"]) == pytest.approx(1.0)
    assert _row(merged, "rmsnorm")["total_s"] == pytest.approx(0.7) and _row(merged, "linear")["calls"] == 20
    assert merged["busy_seconds"] == pytest.approx(HOT_NORM["busy_seconds"] + HOT_LINEAR["busy_seconds"])
    assert merged["output_tokens"] == 20 and merged["tokens_per_second"] == pytest.approx(10.0)
    assert [(e["url"], e["weight"]) for e in merged["engines"]] == [(A, 0.5), (B, 0.5)]
    assert A in merged["notes"][0] and B in merged["notes"][0] and merged["engine"] == f"fleet: {A}, {B}"
    assert [r["total_s"] for r in merged["rows"]] == sorted((r["total_s"] for r in merged["rows"]), reverse=True)


def test_shapes_merge_per_bucket() -> None:
    wide = _profile(B, rmsnorm_s=0.3, linear_s=0.1, tokens=10, hidden=4096)  # another rmsnorm bucket
    shapes = _row(merge_profiles([HOT_NORM, wide]), "rmsnorm")["shapes"]
    assert len(shapes) == 2 and shapes[0]["seconds"] == pytest.approx(0.6) and shapes[1]["shape"]["hidden"] == 4096
    same = _row(merge_profiles([HOT_NORM, _profile(B, 0.3, 0.1, 10)]), "rmsnorm")["shapes"]
    assert len(same) == 1 and same[0]["calls"] == 20 and same[0]["seconds"] == pytest.approx(0.9)


def test_served_tokens_decide_the_fleets_hottest_op() -> None:
    """Each engine's hottest op differs; the engine that serves most of the tokens decides the target."""
    assert choose_target(HOT_NORM, NoHistory())[0] == "rmsnorm" and choose_target(HOT_LINEAR, NoHistory())[0] == "linear"
    norm_fleet = merge_profiles([HOT_NORM, HOT_LINEAR], served_tokens=[900, 100])
    # per generated token x share of served tokens: A's seconds x 1.8, B's x 0.2
    assert _row(norm_fleet, "rmsnorm")["total_s"] == pytest.approx(0.6 * 1.8 + 0.1 * 0.2)
    assert choose_target(norm_fleet, NoHistory())[0] == "rmsnorm"
    linear_fleet = merge_profiles([HOT_NORM, HOT_LINEAR], served_tokens=[100, 900])
    assert choose_target(linear_fleet, NoHistory())[0] == "linear"
    for merged in (norm_fleet, linear_fleet):
        assert not _problems(merged, Profile) and sum(r["share"] for r in merged["rows"]) == pytest.approx(1.0)
    assert [e["weight"] for e in linear_fleet["engines"]] == [pytest.approx(0.1), pytest.approx(0.9)]


def test_a_slower_engine_counts_per_token_not_per_second() -> None:
    """The same op mix, one engine twice as slow per token: equal served tokens weigh their time per token."""
    slow = _profile(B, rmsnorm_s=0.1, linear_s=0.9, tokens=5)  # B's seconds cover half the tokens
    merged = merge_profiles([HOT_NORM, slow], served_tokens=[50, 50])
    assert _row(merged, "linear")["total_s"] == pytest.approx(0.2 * 0.75 + 0.9 * 1.5)


def test_merge_refuses_what_it_cannot_merge() -> None:
    with pytest.raises(KernelloopError, match="no engine profiles"):
        merge_profiles([])
    with pytest.raises(KernelloopError, match="different devices"):
        merge_profiles([HOT_NORM, {**HOT_LINEAR, "device": "NVIDIA H100"}])


class FakeEngine:
    """An engine handle (agent/engine_handle.py) that records what it was asked."""

    def __init__(self, url: str, profile: Profile, fail_reload: bool = False, **health: Any) -> None:
        self.url, self._profile, self.fail_reload = url, profile, fail_reload
        self.health = {"kernels": "registry", "device": "cpu-interpreter", "model_dir": "/m", "registry": "/r", **health}
        self.calls: list[tuple] = []

    def profile(self, workload, progress=lambda m: None):  # noqa: ANN001
        progress("request 1/1")
        self.calls.append(("profile",))
        return self._profile

    def reload(self, revision=None):  # noqa: ANN001
        self.calls.append(("reload", revision))
        if self.fail_reload:
            raise KernelloopError(f"{self.url}/kernels/reload failed: HTTP 500: boom")
        return {"rmsnorm": {"float32 hidden=64": ["baseline", "registry:x"]}}

    def measure(self, prompt_ids, config, warmup=True):  # noqa: ANN001
        self.calls.append(("measure",))
        return "measured"

    def generate(self, prompt_ids, max_tokens, seeds):  # noqa: ANN001
        self.calls.append(("generate",))
        return [[1]]

    def invariance(self, prompt_ids, max_tokens, batch):  # noqa: ANN001
        self.calls.append(("invariance",))
        return {}

    def close(self) -> None:
        self.calls.append(("close",))


def test_fleet_profiles_every_engine_reloads_every_engine_and_gates_on_the_first() -> None:
    a, b = FakeEngine(A, HOT_NORM), FakeEngine(B, HOT_LINEAR)
    fleet = FleetEngine([a, b], served=lambda e: {A: 100.0, B: 900.0}[e.url])
    messages: list[str] = []
    merged = fleet.profile([], messages.append)
    assert choose_target(merged, NoHistory())[0] == "linear"  # B serves 90% of the tokens
    assert sorted(messages) == [f"{A}: request 1/1", f"{B}: request 1/1"]
    assert fleet.reload() == {"rmsnorm": {"float32 hidden=64": ["baseline", "registry:x"]}}
    assert ("reload", None) in a.calls and ("reload", None) in b.calls and set(fleet.reloads) == {A, B}
    fleet.reload("abc^")  # the gate's alternation: the measured engine only
    assert ("reload", "abc^") in a.calls and ("reload", "abc^") not in b.calls
    assert fleet.measure([[1]], GateConfig()) == "measured"
    fleet.generate([[1]], 4, [None])
    fleet.invariance([[1]], 2, 4)
    gated = {"measure", "generate", "invariance"}
    assert gated <= {c[0] for c in a.calls} and not gated & {c[0] for c in b.calls}
    assert fleet.url == A
    fleet.close()
    assert ("close",) in a.calls and ("close",) in b.calls


def test_unknown_served_tokens_fall_back_to_profiled_tokens() -> None:
    fleet = FleetEngine([FakeEngine(A, HOT_NORM), FakeEngine(B, HOT_LINEAR)], served=lambda e: {A: 100.0}.get(e.url))
    assert [e["weight"] for e in fleet.profile([])["engines"]] == [0.5, 0.5]


def test_a_failing_reload_names_the_engine() -> None:
    fleet = FleetEngine([FakeEngine(A, HOT_NORM), FakeEngine(B, HOT_LINEAR, fail_reload=True)], served=lambda e: None)
    with pytest.raises(KernelloopError) as caught:
        fleet.reload()
    text = str(caught.value)
    assert f"engine {B} did not reload" in text and "boom" in text and f"(reloaded: {A})" in text
    assert "\n" not in text


@pytest.mark.parametrize("key, value", [("registry", "/other"), ("model_dir", "/m2"), ("device", "NVIDIA H100"),
                                        ("kernels", "baseline")])
def test_engines_that_disagree_are_refused(key: str, value: str) -> None:
    with pytest.raises(KernelloopError, match=f"differ in {key}: {A} has .* {B} has '{value}'"):
        FleetEngine([FakeEngine(A, HOT_NORM), FakeEngine(B, HOT_LINEAR, **{key: value})])
    FleetEngine([FakeEngine(A, HOT_NORM), FakeEngine(B, HOT_LINEAR)])  # the control: the same everywhere


def test_an_audit_rollback_reloads_what_the_daemon_gives_it(tmp_path: Path) -> None:
    """The daemon of a fleet audits the first engine; its rollback must reach every engine (the fleet's reload)."""
    from types import SimpleNamespace

    from kernelloop.agent.auditor import Auditor
    from kernelloop.history import History

    from tests.test_registry import add

    reloaded: list[str] = []
    source = SimpleNamespace(url=A, reload=lambda: reloaded.append("first engine"))
    for reload, expected in ((lambda: reloaded.append("fleet"), "fleet"), (None, "first engine")):  # + the control
        reg = Registry(tmp_path / expected / "reg")
        add(reg)
        with History(tmp_path / expected / "h.db") as history:
            auditor = Auditor(source, None, reg, history, reload=reload)  # type: ignore[arg-type]
            assert auditor._roll_back(reg.head(), "breach", {}) is not None
        assert reloaded.pop() == expected and not reloaded and reg.entries() == []


@contextmanager
def _health_server(health: dict[str, Any]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering GET /health with `health` (all `agent tune` reads of a fleet
    before it refuses one)."""
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(health).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_agent_tune_refuses_a_fleet_on_two_registries_in_one_line(tmp_path: Path, capsys) -> None:
    from kernelloop.agent import cli

    health = {"status": "ok", "kernels": "registry", "device": "cpu-interpreter", "model_dir": str(tmp_path),
              "registry": str(tmp_path / "r1")}
    with _health_server(health) as a, _health_server({**health, "registry": str(tmp_path / "r2")}) as b:
        code = cli.main(["tune", "rmsnorm", "--engine", a, "--engine", b, "--history", str(tmp_path / "h.db")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"differ in registry: {a}" in err and b in err


# -- end to end: two `engine serve --kernels registry` processes ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model_dir: Path, registry: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernelloop.engine.cli", "serve", "--model", str(model_dir),
                             "--device", "cpu", "--kernels", "registry", "--registry", str(registry), "--port", str(port)],
                            cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    pytest.fail(f"engine serve did not come up: {log.read_text()[-2000:]}")


@pytest.mark.slow
def test_agent_tune_a_fleet_of_two_serving_engines(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path / "ckpt", "gqa")
    registry = tmp_path / "reg"
    Registry(registry)  # one registry both engines serve
    engines = [_serve(model_dir, registry, tmp_path / f"engine{i}.log") for i in range(2)]
    try:
        for i, (proc, url) in enumerate(engines):
            _wait_healthy(proc, url, tmp_path / f"engine{i}.log")
        (a, b) = (url for _, url in engines)
        # the search's candidates are correct; any of them is taken (--min-gain), and the gate is lenient on
        # speed: what is tested is where the profile, the reload and the gate go, not speed
        result = subprocess.run(
            [sys.executable, "-m", "kernelloop.agent.cli", "tune", "rmsnorm", "--engine", a, "--engine", b,
             "--rounds", "1", "--candidates", "1", "--min-gain", "-0.9", "--gate-tps-tolerance", "0.95",
             "--history", str(tmp_path / "h.db"), "--json", "--gate-runaway-tokens", "0",
             "--gate-invariance-tokens", "0"],
            cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        state = json.loads(result.stdout)
        assert state["status"] == "winner", state["reason"]
        assert state["gate"]["engine"] == a  # the gate ran on the first engine
        entry = Registry(registry).entries()[0]
        metric = f'variant="registry:{entry.id}"'
        # Each engine lists the variants of the shapes it has run: one request whose prefill is the committed
        # shape (an engine may not have run that bucket while profiled), then both serve the commit (reloaded).
        tokens = state["shapes"][0]["tokens"]
        for url in (a, b):
            name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": [7] * tokens, "max_tokens": 1,
                                                      "temperature": 0}, timeout=300).raise_for_status()
            lines = [line for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
                     if line.startswith("kernelloop_kernel_variant{op=\"rmsnorm\"")]
            assert any(metric in line for line in lines), (url, entry.bucket, lines)
    finally:
        for proc, _ in engines:
            proc.terminate()
        for proc, _ in engines:
            proc.wait(30)
    from kernelloop.history import History

    with History(tmp_path / "h.db") as history:
        profile = history.latest_profile()
        events = {e["kind"]: e for e in history.registry_events(op="rmsnorm")}
    assert profile is not None and profile["engine"] == f"fleet: {a}, {b}"
    assert events["gate"]["detail"]["engine"] == a and events["reload"]["detail"]["engines"] == [a, b]
