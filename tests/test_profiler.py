"""Profiling a real engine run (embedded model, CPU): shares, op rows with shapes, HTTP, bad engines."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.kernels.ops import OPS
from kernelloop.kernels.quant import SCHEME_OF_OP
from kernelloop.kernels.roofline import Rates
from kernelloop.profiler.analysis import profile_rows
from kernelloop.profiler.http import profile_url
from kernelloop.profiler.inprocess import profile_engine
from kernelloop.profiler.workload import agent_workload

from tests.serving import serve

REPO = Path(__file__).resolve().parents[1]


def check_profile(profile: dict, config: ModelConfig) -> None:
    rows = {r["name"]: r for r in profile["rows"]}
    assert sum(r["share"] for r in profile["rows"]) == pytest.approx(1.0)
    served = set(OPS) - set(SCHEME_OF_OP)  # the quantized linears run only for quantized layers
    assert served <= set(rows), sorted(rows)  # every other op of the library ran
    for op in sorted(served):
        r = rows[op]
        assert r["kind"] == "op" and r["calls"] > 0 and r["total_s"] > 0 and r["shapes"]
        for s in r["shapes"]:
            assert s["dtype"] == "float32" and s["bucket"] == OPS[op].bucket(s["shape"])
        assert r["roofline_pct"] is not None and r["roofline_pct"] > 0
    others = {name for name, r in rows.items() if r["kind"] == "other"}
    assert others == {"other model compute", "sampling", "scheduling", "python overhead"}  # no torch matmul or attention
    assert rows["rmsnorm"]["variant"] == rows["linear"]["variant"] == "reference"
    # every projection by its (n, k): fused qkv, o_proj, fused gate_up, down, lm_head
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    projections = {(q + 2 * kv, h), (h, q), (2 * i, h), (h, i), (config.vocab_size, h)}
    assert {(s["shape"]["n"], s["shape"]["k"]) for s in rows["linear"]["shapes"]} == projections
    for s in rows["extend_attention"]["shapes"]:
        assert (s["shape"]["q_heads"], s["shape"]["kv_heads"], s["shape"]["head_dim"]) == \
            (config.num_heads, config.num_kv_heads, config.head_dim)
    assert any(s["shape"]["prefix"] > 0 for s in rows["extend_attention"]["shapes"])  # cached prefixes were read
    assert profile["output_tokens"] > 0 and profile["tokens_per_second"] > 0
    assert profile["ttft_ms_median"] > 0 and profile["tpot_ms_median"] > 0


@pytest.fixture(scope="module")
def engine(embedded_model_dir: Path) -> Engine:
    return Engine(EngineConfig(model=str(embedded_model_dir)))


def test_in_process_profile(engine: Engine, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    profile = profile_engine(engine, agent_workload(10, seed=1), concurrency=4, trace_path=trace)
    check_profile(profile, engine.model_config)
    assert not profile["partial"] and profile["requests"] == 10
    assert profile["prefix_hit_rate"] > 0  # conversations continue: their history is cached
    # decode and prefill both happened: decode_attention at batch 1.. and rope at several token buckets
    assert len(next(r for r in profile["rows"] if r["name"] == "rope")["shapes"]) >= 2
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"kernelloop::rmsnorm", "kernelloop::linear", "kernelloop::extend_attention", "kernelloop::decode_attention",
            "kernelloop::step"} <= names
    assert engine.recorder is None and engine.kernels.observer is None  # profiling leaves nothing behind


def test_http_profile(engine: Engine) -> None:
    with serve(engine, "embedded") as (base, _):
        profile = profile_url(base, agent_workload(8, seed=2), concurrency=4, seconds=120)
    check_profile(profile, engine.model_config)
    assert profile["engine"] == base and profile["requests"] == 8 and not profile["partial"]


def test_shares_add_up_even_when_clocks_disagree() -> None:
    raw = {"regions": {"step": {"calls": 2, "seconds": 1.0}, "forward": {"calls": 2, "seconds": 0.9},
                       "sample": {"calls": 2, "seconds": 0.2}, "schedule": {"calls": 2, "seconds": 0.05}},
           "ops": [{"op": "rmsnorm", "dtype": "float32", "shape": {"tokens": 3, "hidden": 64}, "calls": 5, "seconds": 0.5},
                   {"op": "linear", "dtype": "float32", "shape": {"tokens": 3, "n": 96, "k": 64}, "calls": 4,
                    "seconds": 0.5}]}
    rows = {r["name"]: r for r in profile_rows(raw, rates=lambda dtype: Rates(1e9, 1e12))}
    assert rows["other model compute"]["total_s"] == 0.0  # 0.9 - 0.5 - 0.5 < 0: clamped, not negative
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert rows["rmsnorm"]["shapes"][0]["bucket"] == "hidden=64,tokens=2-16"
    assert rows["linear"]["kind"] == "op" and rows["linear"]["shapes"][0]["bucket"] == "k=64,n=96,tokens=2-16"


class _DyingEngine(BaseHTTPRequestHandler):
    """Answers health, models and profile start, then fails every request: an engine falling over."""

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._json({"status": "ok", "device": "cpu-interpreter", "kernels": "reference"} if self.path == "/health"
                   else {"data": [{"id": "m"}]})

    def do_POST(self) -> None:  # noqa: N802
        if self.path == "/profile/start" or (self.path == "/profile/stop" and not self.server.started):
            self.server.started = True
            self._json({"status": "started"})
        else:
            self.connection.close()  # mid-request death: no status line at all


def test_an_engine_dying_mid_profile_gives_a_partial_result() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _DyingEngine)
    srv.started = False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        profile = profile_url(f"http://127.0.0.1:{srv.server_address[1]}", agent_workload(4), concurrency=2, seconds=30)
    finally:
        srv.shutdown()
    assert profile["partial"] and profile["partial_reason"]
    assert profile["rows"] == [] and profile["requests"] == 0


def test_an_unreachable_engine_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", "profile", "--engine", "http://127.0.0.1:9",
                             "--history", str(tmp_path / "h.db")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "cannot reach a kernelloop engine at http://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "h.db").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")
def test_ncu_is_a_clean_skip_without_a_gpu() -> None:
    from kernelloop.profiler.ncu import ncu_metrics

    result = ncu_metrics("rmsnorm", {"tokens": 2, "hidden": 64}, "float32", timeout_s=120)
    assert result["op"] == "rmsnorm" and not result["available"]
    assert result["reason"] and "\n" not in result["reason"] and result["metrics"] == {}


def test_roofline_pct_is_the_least_time_over_the_time_taken() -> None:
    """Each call is held to max(bytes / bandwidth, FLOPs / matmul peak): a device with a slow enough
    matmul makes the same calls compute-bound and their roofline the FLOPs side."""
    shape = {"tokens": 3, "hidden": 64}
    cost = OPS["rmsnorm"].cost(shape, torch.float32)
    raw = {"regions": {"step": {"calls": 1, "seconds": 1.0}, "forward": {"calls": 1, "seconds": 1.0}},
           "ops": [{"op": "rmsnorm", "dtype": "float32", "shape": shape, "calls": 4, "seconds": 0.5}]}
    row = {r["name"]: r for r in profile_rows(raw, rates=lambda dtype: Rates(1e9, 1e15))}["rmsnorm"]
    assert row["bound"] == "memory" and row["roofline_pct"] == pytest.approx(100 * 4 * cost.bytes / 1e9 / 0.5)
    slow = cost.flops / (10 * cost.bytes / 1e9)  # FLOPs take 10x as long as the bytes
    row = {r["name"]: r for r in profile_rows(raw, rates=lambda dtype: Rates(1e9, slow))}["rmsnorm"]
    assert row["bound"] == "compute" and row["roofline_pct"] == pytest.approx(100 * 4 * cost.flops / slow / 0.5)
    assert {r["name"]: r for r in profile_rows(raw, rates=None)}["rmsnorm"]["roofline_pct"] is None
