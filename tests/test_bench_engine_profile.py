"""bench.engine_gpu and bench.profile_gpu off the GPU: the decode bound's bytes, reports written as rows
come in, the checks that fail the step, the profile's op-time replay (device times on CUDA) and the
cheap ncu check. The whole rehearsals (`--rehearse`) run in bench/gpu_check.sh --rehearse (CI)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
import torch

import kernelloop.profiler.ncu as ncu
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.recorder import Recorder, interpolate, replay_op_seconds
from kernelloop.engine.scheduler import SchedulerConfig
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.ops import OPS
from kernelloop.kernels.quant import SCHEME_OF_OP
from kernelloop.kernels.roofline import Rates
from kernelloop.profiler.analysis import profile_rows
from kernelloop.profiler.inprocess import profile_engine

import bench.engine_gpu as engine_gpu
import bench.profile_gpu as profile_gpu
from bench.rehearse import CHAT_TEMPLATE, TINY_LLAMA, write_chat_model_dir
from bench.report import format_value

# ---- decode bound -------------------------------------------------------------------------------


def test_decode_step_bytes_reads_only_the_batch_rows_of_an_untied_embedding():
    row = 64 * 2
    params = {"embed_tokens": 1000 * row, "lm_head": 1000 * row, "layers.0.qkv_proj": 5000, "norm": 128}
    rest = 1000 * row + 5000 + 128
    assert engine_gpu.decode_step_bytes(params, 1, 1000, tied=False) == rest + row
    assert engine_gpu.decode_step_bytes(params, 32, 1000, tied=False) == rest + 32 * row
    assert engine_gpu.decode_step_bytes(params, 5000, 1000, tied=False) == rest + 1000 * row  # never > the table
    with pytest.raises(ValueError):
        engine_gpu.decode_step_bytes(params, 0, 1000, tied=False)


def test_decode_step_bytes_tied_reads_the_table_once_through_the_lm_head():
    params = {"embed_tokens": 1000 * 128, "layers.0.qkv_proj": 5000, "norm": 128}  # tied: no lm_head entry
    assert engine_gpu.decode_step_bytes(params, 1, 1000, tied=True) == 1000 * 128 + 5000 + 128
    assert engine_gpu.decode_step_bytes(params, 64, 1000, tied=True) == 1000 * 128 + 5000 + 128


def test_llama3_8b_step_bytes_leave_out_all_but_one_embedding_row():
    c = engine_gpu.LLAMA3_8B
    embed = c["vocab_size"] * c["hidden_size"] * 2
    params = {"embed_tokens": embed, "lm_head": embed, "layers": 13_000_000_000}
    assert engine_gpu.decode_step_bytes(params, 1, c["vocab_size"], tied=False) == embed + 13_000_000_000 + c["hidden_size"] * 2


# ---- engine_gpu: report as it goes, checks -------------------------------------------------------


def _fake_decode(fail_on_call: int | None = None):
    calls = []

    def fake(engine, batch, prompt_len, new_tokens):
        calls.append(batch)
        if fail_on_call is not None and len(calls) == fail_on_call:
            raise RuntimeError("killed")  # what a timeout looks like from the report's side
        return {"total_s": 2.0, "decode_s": 1.0, "decode_tokens": batch * (new_tokens - 1),
                "total_tokens": batch * new_tokens}

    return fake


def test_engine_gpu_writes_a_partial_report_after_each_row(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_gpu, "measure_copy_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(engine_gpu, "engine_decode", _fake_decode(fail_on_call=3))  # warm-up, batch 1, then dies
    with pytest.raises(RuntimeError, match="killed"):
        engine_gpu.main(["--rehearse", "--batches", "1,2", "--no-hf", "--out-dir", str(tmp_path)])
    report = next(tmp_path.glob("*-cpu-interpreter-engine-decode.md")).read_text()
    assert "PARTIAL: stopped after the engine at batch 1" in report
    assert "| kernelloop (baseline kernels, cuda graphs off) | 1 |" in report and "| 2 |" not in report


def test_engine_gpu_rehearsal_bound_and_transformers_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_gpu, "measure_copy_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(engine_gpu, "engine_decode", _fake_decode())
    rc = engine_gpu.main(["--rehearse", "--batches", "1,2", "--new-tokens", "2", "--out-dir", str(tmp_path)])
    assert rc == 0
    report = next(tmp_path.glob("*-engine-decode.md")).read_text()
    assert "PARTIAL" not in report and "| transformers generate | 2 |" in report
    engine = Engine(EngineConfig(model=str(write_chat_model_dir(tmp_path, TINY_LLAMA)), dtype="bfloat16",
                                 random_weights=True, kv_cache_bytes=8 << 20))
    params = {n: t.numel() * t.element_size() for n, t in engine.model.parameters().items()}
    step = engine_gpu.decode_step_bytes(params, 2, TINY_LLAMA["vocab_size"], tied=False)
    assert step < sum(params.values())  # 382 of 384 embedding rows are not read
    assert f"| {format_value(round(2 * 1e9 / step, 1))} |" in report  # bound tok/s at batch 2


def test_engine_gpu_fails_when_an_op_fell_back_to_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_gpu, "measure_copy_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(engine_gpu, "engine_decode", _fake_decode())
    monkeypatch.setattr(Dispatcher, "variants_in_use",
                        lambda self: {"rmsnorm": {"bfloat16 hidden=64,tokens=1": "reference"}})
    assert engine_gpu.main(["--rehearse", "--batches", "1", "--no-hf", "--out-dir", str(tmp_path)]) == 1


def test_rehearsal_needs_the_interpreter(monkeypatch, capsys):
    monkeypatch.setattr("bench.rehearse.triton_interpreted", lambda: False)
    assert engine_gpu.main(["--rehearse"]) == 2
    assert profile_gpu.main(["--rehearse"]) == 2
    assert "TRITON_INTERPRET=1" in capsys.readouterr().err


def test_profile_gpu_still_exports_the_chat_template():
    assert profile_gpu.CHAT_TEMPLATE == CHAT_TEMPLATE  # bench.tune_gpu imports it from here


# ---- op-time replay (the GPU's device times; perf_counter on CPU) --------------------------------


def test_interpolate_is_piecewise_linear_and_flat_outside():
    points = [(10.0, 1.0), (20.0, 3.0), (40.0, 4.0)]
    assert interpolate(5, points) == 1.0 and interpolate(50, points) == 4.0
    assert interpolate(15, points) == pytest.approx(2.0) and interpolate(30, points) == pytest.approx(3.5)
    assert interpolate(7, [(3.0, 2.0)]) == 2.0


def _entries(*tokens: int, seconds: float = 1.0) -> list[dict]:
    return [{"op": "rmsnorm", "dtype": "float32", "shape": {"tokens": t, "hidden": 64}, "calls": 2, "seconds": seconds,
             "timing": "cpu-wall"} for t in tokens]


def test_replay_prices_every_shape_from_a_few_replayed_ones():
    kd = Dispatcher(mode="reference", device=CPU)
    ops, errors = replay_op_seconds(_entries(17, 20, 40, 100, 1), kd, CPU)
    assert errors == []
    by_tokens = {o["shape"]["tokens"]: o for o in ops}
    assert all(o["timing"] == "cpu-wall-replay" and o["in_run_seconds"] == 1.0 for o in ops)
    assert all(0 < o["seconds"] < 1.0 for o in ops)  # 2 calls of a 64-wide rmsnorm: microseconds, not the fake 1 s
    # tokens=17-128 is one bucket: first, middle and last by bytes replayed, 20 interpolated between 17 and 40
    assert [t for t, o in sorted(by_tokens.items()) if o["replayed"]] == [1, 17, 40, 100]
    lo, hi = sorted((by_tokens[17]["seconds"], by_tokens[40]["seconds"]))
    assert lo <= by_tokens[20]["seconds"] <= hi


def test_a_replay_that_raises_keeps_the_in_run_times_and_demotes_nothing():
    def boom(x, weight, eps):
        raise RuntimeError("bad kernel")

    kd = Dispatcher(mode="reference", device=CPU, ops={"rmsnorm": dataclasses.replace(OPS["rmsnorm"], reference=boom)})
    ops, errors = replay_op_seconds(_entries(17, 40), kd, CPU)
    assert [o["seconds"] for o in ops] == [1.0, 1.0] and {o["timing"] for o in ops} == {"cpu-wall"}
    assert len(errors) == 1 and "RuntimeError: bad kernel" in errors[0]
    ops, errors = replay_op_seconds(_entries(17), Dispatcher(mode="reference", device=CPU), CPU, budget_s=-1)
    assert ops[0]["seconds"] == 1.0 and "replay budget" in errors[0]


def test_recorder_replays_only_when_asked_on_cpu():
    rec = Recorder(CPU, dispatcher=Dispatcher(mode="reference", device=CPU))
    assert not rec.replays()  # auto: CPU op times stay perf_counter
    rec.attach(rec.dispatcher, "replay")
    assert rec.replays()
    rec.attach(rec.dispatcher, "in-run")
    assert not rec.replays()
    with pytest.raises(ValueError):
        rec.attach(None, "kernel")
    assert Recorder(CPU).collect()["op_timing"] is None


def test_rows_say_which_clock_timed_them():
    raw = {"device": "cuda", "regions": {"step": {"calls": 1, "seconds": 1.0}, "forward": {"calls": 1, "seconds": 0.9}},
           "ops": _entries(17)}
    raw["ops"][0].pop("timing")  # an engine that does not label its op times: its device says how
    rows = {r["name"]: r for r in profile_rows(raw, rates=lambda dtype: Rates(1e9, 1e12))}
    assert rows["rmsnorm"]["timing"] == "cuda-events" and rows["other model compute"]["timing"] == "cuda-events"
    raw["ops"] = _entries(17) + [{**_entries(40)[0], "timing": "cuda-kernel-replay", "in_run_seconds": 3.0}]
    rows = {r["name"]: r for r in profile_rows({**raw, "device": "cpu"}, rates=lambda dtype: Rates(1e9, 1e12))}
    assert rows["rmsnorm"]["timing"] == "cpu-wall+cuda-kernel-replay" and rows["rmsnorm"]["in_run_s"] == 4.0


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory) -> Engine:
    model_dir = write_chat_model_dir(tmp_path_factory.mktemp("tiny"), TINY_LLAMA)
    return Engine(EngineConfig(model=str(model_dir), dtype="bfloat16", kernels="reference", random_weights=True,
                               kv_cache_bytes=16 << 20, scheduler=SchedulerConfig(max_running_requests=2)))


def test_profile_with_replayed_op_times_and_the_steps_checks(tiny_engine):
    plan = profile_gpu.REHEARSAL
    profile = profile_engine(tiny_engine, profile_gpu.workload(3, 0, plan), concurrency=2, op_timing="replay")
    ops = [r for r in profile["rows"] if r["kind"] == "op"]
    # every projection and both attentions are ops now; the quantized linears serve only quantized layers
    assert {r["name"] for r in ops} == set(OPS) - set(SCHEME_OF_OP)
    assert {r["name"] for r in profile["rows"] if r["kind"] == "other"} == {
        "other model compute", "sampling", "scheduling", "python overhead"}
    linear = next(r for r in ops if r["name"] == "linear")
    assert {(s["shape"]["n"], s["shape"]["k"]) for s in linear["shapes"]} >= {
        (TINY_LLAMA["vocab_size"], TINY_LLAMA["hidden_size"]), (2 * TINY_LLAMA["intermediate_size"], TINY_LLAMA["hidden_size"])}
    assert profile["op_timing"] == "cpu-wall-replay" and profile["region_timing"] == "cpu-wall"
    assert all(r["timing"] == "cpu-wall-replay" and r["in_run_s"] > 0 for r in ops)
    assert sum(r["share"] for r in profile["rows"]) == pytest.approx(1.0)
    assert profile_gpu.problems(profile, CPU, "reference") == []
    fallen = profile_gpu.problems(profile, CPU, "baseline")  # reference variants served: a fallback
    assert len(fallen) == 1 and "fell back to the reference" in fallen[0]
    assert any("cuda-kernel-replay" in p for p in profile_gpu.problems(profile, CUDA, "reference"))
    rows = profile_gpu.table(profile)
    assert {"timing", "in-run us", "mean us"} <= set(rows[0])
    assert tiny_engine.recorder is None and tiny_engine.kernels.observer is None


def test_profile_rejects_an_unknown_op_timing_before_recording(tiny_engine):
    with pytest.raises(ValueError):
        profile_engine(tiny_engine, profile_gpu.workload(1, 0, profile_gpu.REHEARSAL), op_timing="events")
    assert tiny_engine.recorder is None


# ---- ncu: a cheap check before the 40 s run ----------------------------------------------------------


def _fake_ncu(directory: Path, rc: int, said: str = "") -> None:
    path = directory / "ncu"
    path.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def gpu_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ncu, "nsight_python_version", lambda: "1.1.0")


def test_ncu_needs_nsight_python_1_1(gpu_present, monkeypatch):
    monkeypatch.setattr(ncu, "nsight_python_version", lambda: None)
    assert "nsight-python is not installed" in ncu.availability()
    monkeypatch.setattr(ncu, "nsight_python_version", lambda: "1.0.3")
    assert ncu.availability() == "nsight-python 1.0.3 is older than 1.1"
    assert ncu._version_tuple("1.1rc1") >= ncu.NSIGHT_PYTHON_MIN > ncu._version_tuple("0.9.6")


@pytest.mark.filterwarnings("ignore:Could not determine the NVIDIA Nsight Compute version")
def test_ncu_needs_an_ncu_that_runs(gpu_present, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ncu.availability() == "ncu (Nsight Compute) is not on PATH"
    _fake_ncu(tmp_path, 3, "ERR_NVGPUCTRPERM")
    reason = ncu.availability()
    assert "--version` failed (exit 3: ERR_NVGPUCTRPERM)" in reason and "\n" not in reason
    _fake_ncu(tmp_path, 0)
    assert ncu.availability() == ""  # nsight-python is installed here (a dev dependency)


def test_ncu_metrics_skips_at_once_without_starting_the_run(gpu_present, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    started = []
    real_run = ncu.subprocess.run
    monkeypatch.setattr(ncu.subprocess, "run", lambda cmd, **kw: started.append(cmd) or real_run(cmd, **kw))
    result = ncu.ncu_metrics("rmsnorm", {"tokens": 2, "hidden": 64}, "float32", timeout_s=40)
    assert not result["available"] and result["reason"] == "ncu (Nsight Compute) is not on PATH"
    assert result["op"] == "rmsnorm" and result["metrics"] == {} and started == []
    assert os.environ["PATH"] == str(tmp_path)
