"""The benchmark harness: timing primitives, the report writer, bench.baselines and gpu_check.sh."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernelloop import kernels
from kernelloop.kernels import OPS
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.spec import pick_shapes
from kernelloop.kernels.timing import measure_copy_bandwidth, summarize, time_calls

from bench.baselines import DEFAULT_MAX_SHAPES
from bench.report import print_table, write_report

REPO = Path(__file__).resolve().parents[1]


def test_time_calls_cpu_counts_and_positive_samples():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    samples = time_calls(fn, CPU, warmup=2, reps=5)
    assert len(samples) == 5
    assert len(calls) == 7  # warmup calls run but are not timed
    assert all(0.002 <= s < 1.0 for s in samples)


def test_time_calls_rejects_zero_reps():
    with pytest.raises(ValueError):
        time_calls(lambda: None, CPU, warmup=0, reps=0)


def test_summarize_known_list():
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert s["median"] == pytest.approx(3.0)
    assert s["p20"] == pytest.approx(1.8)
    assert s["p80"] == pytest.approx(4.2)
    assert s["min"] == 1.0
    assert s["n"] == 5
    assert summarize([2.0, 4.0])["median"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        summarize([])


def test_copy_bandwidth_cpu_is_positive():
    assert measure_copy_bandwidth(CPU, nbytes=8 << 20) > 0


def test_pick_shapes_spans_the_list():
    picked = pick_shapes(list(range(42)), 12)
    assert len(picked) == 12 and picked[0] == 0 and picked[-1] == 41 and picked == sorted(set(picked))
    assert pick_shapes(list(range(5)), 12) == list(range(5))
    assert pick_shapes(list(range(5)), 1) == [0]
    assert pick_shapes(list(range(5)), 0) == list(range(5))
    rms = pick_shapes(kernels.get_op("rmsnorm").engine_shapes, DEFAULT_MAX_SHAPES)
    tokens = {s["tokens"] for s in rms}
    assert min(tokens) == 1 and max(tokens) >= 2048  # decode and prefill
    assert len({s["hidden"] for s in rms}) >= 5  # most models


def test_write_report_and_print_table(tmp_path, capsys):
    rows = [{"op": "x", "shape": "tokens=1", "us": 12.345, "ok": True}, {"op": "y", "shape": "t|2", "us": None}]
    path = write_report("unit", "Unit report", rows, device="cpu", command="cmd --flag", notes=["a note"],
                        out_dir=tmp_path)
    assert path.parent == tmp_path and path.name.endswith("-cpu-interpreter-unit.md")
    text = path.read_text()
    for needle in ("# Unit report", "cpu-interpreter", "not a GPU", "`cmd --flag`", "commit:", "torch ",
                   "| op | shape | us | ok |", "| x | tokens=1 | 12.3 | yes |", "t\\|2", "- a note"):
        assert needle in text, needle
    print_table(rows)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["op", "shape", "us", "ok"] and len(out) == 4


def test_baselines_cpu_quick_run(tmp_path):
    cmd = [sys.executable, "-m", "bench.baselines", "--device", "cpu", "--quick", "--dtypes", "float32",
           "--max-shapes-per-op", "1", "--out-dir", str(tmp_path)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in kernels.OPS:
        assert name in proc.stdout, f"{name} missing from the printed table"
    reports = list(tmp_path.glob("*-cpu-interpreter-baselines.md"))
    assert len(reports) == 1, list(tmp_path.iterdir())
    text = reports[0].read_text()
    assert "cpu-interpreter" in text and "not a GPU" in text
    for name in kernels.OPS:
        assert any(line.startswith(f"| {name} |") for line in text.splitlines()), f"no row for {name}"


def test_baselines_rejects_unknown_op():
    proc = subprocess.run([sys.executable, "-m", "bench.baselines", "--device", "cpu", "--ops", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_gpu_check_script_parses_and_is_executable():
    script = REPO / "bench" / "gpu_check.sh"
    assert os.access(script, os.X_OK)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gpu_check_needs_a_gpu_unless_rehearsing(tmp_path):
    """Without a GPU a real run stops at once (exit 1, nothing run); `--rehearse` without a folder is
    a usage error. (CI runs the whole rehearsal: .ci/run.)"""
    script = str(REPO / "bench" / "gpu_check.sh")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    real = subprocess.run(["bash", script, str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert real.returncode == 1 and "no GPU" in real.stderr and "=== [" not in real.stdout
    usage = subprocess.run(["bash", script, "--rehearse"], capture_output=True, text=True, env=env, timeout=60)
    assert usage.returncode == 2 and "usage: bench/gpu_check.sh [--rehearse] OUT_DIR" in usage.stderr


def test_gpu_check_runs_only_the_steps_named(tmp_path):
    """GPU_CHECK_STEPS (a short lease): the named steps run, the others are not listed at all."""
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_STEPS": "sandbox-cuda"}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--rehearse", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    steps = [line.split()[0] for line in lines[lines.index(next(x for x in lines if x.startswith("step "))) + 1:]]
    assert steps == ["sandbox-cuda"]
    assert "namespaces + landlock + capabilities + seccomp + limits  ok" in (tmp_path / "sandbox-cuda.log").read_text()


@pytest.mark.gpu
def test_cuda_timing_rmsnorm_and_copy_bandwidth():
    spec = kernels.get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 64, "hidden": 4096}, torch.bfloat16, 0, "cuda")
    spec.forward(*args)  # compile outside the timed calls
    samples = time_calls(lambda: spec.forward(*args), CUDA, warmup=3, reps=20)
    assert len(samples) == 20 and all(0 < s < 0.05 for s in samples)
    unflushed = time_calls(lambda: spec.forward(*args), CUDA, warmup=1, reps=5, flush_l2=False)
    assert len(unflushed) == 5 and all(s > 0 for s in unflushed)
    assert measure_copy_bandwidth(CUDA) > 100e9


def test_bench_one_reports_broken_kernels_instead_of_raising():
    from kernelloop.kernels.roofline import Rates

    from bench.baselines import CPU_POLICY, bench_one

    spec = kernels.get_op("rmsnorm")
    shape = spec.test_shapes[0]
    rates = Rates(bytes_per_s=1e9, flops_per_s=1e9)

    def raises(*args):
        raise RuntimeError("boom")

    def wrong(x, weight, eps):
        return spec.forward(x, weight, eps) + 1

    problems: list[str] = []
    row = bench_one(dataclasses.replace(spec, forward=raises), shape, torch.float32, CPU, CPU_POLICY, rates, problems)
    assert row["check"].startswith("error in forward: RuntimeError: boom") and row["triton us"] is None
    assert row["torch us"] > 0 and row["torch"] == "torch eager (the reference)" and len(problems) == 1
    row = bench_one(dataclasses.replace(spec, forward=wrong), shape, torch.float32, CPU, CPU_POLICY, rates, problems)
    assert row["check"].startswith("FAIL") and row["triton us"] > 0 and row["speedup"] > 0
    inputs = spec.make_inputs(shape, torch.float32, 0, "cpu")
    row = bench_one(spec, shape, torch.float32, CPU, CPU_POLICY, rates, problems, inputs)
    assert row["check"] == "ok" and row["% roofline"] > 0 and row["bound"] == "memory" and len(problems) == 2


def test_bench_one_times_linear_against_f_linear_and_the_flop_roofline():
    from kernelloop.kernels.roofline import Rates

    from bench.baselines import CPU_POLICY, bench_one

    spec = kernels.get_op("linear")
    shape = {"tokens": 17, "n": 48, "k": 160}
    problems: list[str] = []
    slow_math = Rates(bytes_per_s=1e12, flops_per_s=1e6)  # a roofline set by the FLOPs
    row = bench_one(spec, shape, torch.float32, CPU, CPU_POLICY, slow_math, problems)
    assert not problems and row["check"] == "ok" and row["torch"] == "F.linear (CPU)"
    assert row["bound"] == "compute" and row["torch err/tol"] < 1 and row["TFLOP/s"] > 0
    cost = spec.cost(shape, torch.float32)
    assert row["% roofline"] == pytest.approx(100 * cost.flops / 1e6 / (row["triton us"] * 1e-6))


def test_dispatch_overhead_benchmark_runs_and_reports(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.dispatch_overhead", "--calls", "2000", "--repeats", "2", "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1 only if a (noisy) CI machine misses the 2 us target
    report = next(tmp_path.glob("*-dispatch-overhead.md")).read_text()
    for name in OPS:
        assert f"| {name} |" in report
    assert "overhead ns" in report


def test_the_gpu_benches_shapes_only_model_tells_prompts_apart(tmp_path):
    """bench.engine_gpu's model directory (used by profile-gpu and tune-gpu): a byte-level tokenizer,
    so different prompts are different tokens (not all the unknown token, which the prefix cache
    would then serve as one prompt), and a random-weight engine runs on it."""
    from kernelloop.agent.gate import prompt_ids
    from kernelloop.agent.gate_config import GATE_PROMPTS
    from kernelloop.engine.engine import Engine, EngineConfig

    from bench.engine_gpu import LLAMA3_8B, write_model_dir

    tiny = {**LLAMA3_8B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
            "bos_token_id": 300, "eos_token_id": 301}
    model_dir = write_model_dir(tmp_path, tiny)
    engine = Engine(EngineConfig(model=str(model_dir), random_weights=True, kv_cache_bytes=8 << 20))
    prompts = prompt_ids(engine, GATE_PROMPTS)
    assert len({tuple(p) for p in prompts}) == len(GATE_PROMPTS)
    for ids in prompts:
        assert len(set(ids)) > 3 and all(0 <= i < 512 for i in ids)
    assert engine.tokenizer.decode(engine.tokenizer.encode("What is 2+2?")) == "What is 2+2?"


# -- bench.counterparts and bench.prefetch ----------------------------------------------------------

EXTEND_GQA = {"batch": 3, "tokens": 40, "prefix": 24, "q_heads": 8, "kv_heads": 2, "head_dim": 64}


@pytest.mark.parametrize("gqa", [True, False])
def test_sdpa_dense_layout_matches_extend_attention_reference(gqa):
    """Both layouts SDPA may run on (torch's GQA, K/V repeated per head) give the op's output, with and
    without a prefix (lower-right causal vs is_causal)."""
    from bench.counterparts import _sdpa, dense_requests

    spec = kernels.get_op("extend_attention")
    args = spec.make_inputs(EXTEND_GQA, torch.float32, 0, "cpu")
    expected = spec.reference(*args)
    requests = dense_requests(*args[:8], repeat_kv=not gqa)
    assert {r.prefix == 0 for r in requests} == {True, False}  # both masks are exercised
    assert all(r.k.shape[1] == (2 if gqa else 8) for r in requests)
    for r in requests:
        out = _sdpa(r, args[8], gqa)[0].transpose(0, 1)
        torch.testing.assert_close(out, expected[r.rows], atol=1e-5, rtol=1e-5)


def test_sdpa_counterpart_names_its_backend_and_prefers_a_layout_that_matches():
    from bench.counterparts import counterpart

    spec = kernels.get_op("extend_attention")
    args = spec.make_inputs(EXTEND_GQA, torch.bfloat16, 0, "cpu")
    expected = spec.reference(*args)
    cp = counterpart(spec, args)
    assert cp.label.startswith("SDPA ") and cp.label.endswith("; GQA") and "flash" in cp.label
    torch.testing.assert_close(cp.output(cp.call()), expected, atol=8e-3, rtol=1.6e-2)
    refused = counterpart(spec, args, accept=lambda out: False)  # nothing matches: the first that ran, marked
    assert refused.label.endswith("(off the reference)")


def test_linear_counterpart_is_ieee_float32():
    from bench.counterparts import counterpart

    spec = kernels.get_op("linear")
    args = spec.make_inputs({"tokens": 5, "n": 130, "k": 72}, torch.float32, 0, "cpu")
    cp = counterpart(spec, args)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # what a user may have set
    try:
        with cp.context():
            assert torch.get_float32_matmul_precision() == "highest"
            out = cp.output(cp.call())
    finally:
        torch.set_float32_matmul_precision(saved)
    torch.testing.assert_close(out, spec.reference(*args))
    assert cp.label == "F.linear (CPU)" and cp.checked


def test_prefetcher_draws_the_same_inputs_ahead_and_reports_failures():
    from bench.prefetch import InputPrefetcher

    spec = kernels.get_op("rmsnorm")
    broken = dataclasses.replace(spec, make_inputs=lambda *a: (_ for _ in ()).throw(ValueError("no inputs")))
    jobs = [(spec, s, torch.float16) for s in spec.test_shapes[:3]] + [(broken, spec.test_shapes[0], torch.float16)]
    prefetch = InputPrefetcher(jobs, workers=2, ahead=2)
    try:
        assert len(prefetch._futures) == 2  # at most `ahead` drawn in advance
        for i, (_, shape, dtype) in enumerate(jobs[:3]):
            got, want = prefetch.get(i), spec.make_inputs(shape, dtype, 0, "cpu")
            assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(got, want))
        with pytest.raises(ValueError, match="no inputs"):
            prefetch.get(3)
    finally:
        prefetch.close()
    skipping = InputPrefetcher(jobs[:3], workers=1, ahead=1)
    assert skipping.get(2)[0].shape[-1] == spec.test_shapes[2]["hidden"]  # rows may be skipped
    skipping.close()
