"""The GPU steps' logic that their CPU rehearsals (gpu_check.sh --rehearse, run by CI) do not pin down:
partial reports after every case/op, the tl.dot kernels first, the baselines' CUDA rows and their
order, the sandbox grouping, the pass rules, the read-only L2 flush of kernels.timing. Cheap: nothing
here runs a whole rehearsal."""

from __future__ import annotations

import pytest
import torch

from kernelloop.kernels import OPS, timing
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.sandbox import CheckOptions, Verdict

import bench.sandbox_gpu as sandbox_gpu
import bench.tune_gpu as tune_gpu
from bench.baseline_plan import FIRST_OPS, groups, is_decode, plan_rows
from bench.baselines import DEFAULT_MAX_SHAPES, DEFAULT_TIME_BUDGET_S, gpu_order, parse_args


def verdict(**fields) -> Verdict:
    return Verdict(op="rmsnorm", device="cpu-interpreter", file="x.py", sha256="0" * 64, **fields)


# -- the tl.dot kernels first; the baselines' rows ---------------------------------------------------

def test_gpu_order_puts_the_tl_dot_kernels_first_and_keeps_the_rest():
    assert gpu_order(list(OPS))[:3] == ["decode_attention", "linear", "extend_attention"] == list(FIRST_OPS)
    assert sorted(gpu_order(list(OPS))) == sorted(OPS)
    assert gpu_order(["rmsnorm", "silu_mul", "decode_attention"]) == ["decode_attention", "rmsnorm", "silu_mul"]
    assert gpu_order(["silu_mul", "rmsnorm"]) == ["silu_mul", "rmsnorm"]
    assert gpu_order([]) == []


def test_baselines_rehearse_arguments():
    args = parse_args(["--rehearse"])
    assert (args.device, args.quick, args.dtypes) == ("cpu", True, "bfloat16")
    assert args.time_budget_s <= 45 and args.max_shapes_per_op == 2
    explicit = parse_args(["--rehearse", "--dtypes", "float32", "--time-budget-s", "5", "--max-shapes-per-op", "1"])
    assert (explicit.dtypes, explicit.time_budget_s, explicit.max_shapes_per_op) == ("float32", 5.0, 1)
    plain = parse_args([])  # the GPU run's defaults are unchanged
    assert (plain.device, plain.quick, plain.dtypes) == (None, False, "bfloat16,float16")
    assert (plain.max_shapes_per_op, plain.time_budget_s) == (DEFAULT_MAX_SHAPES, DEFAULT_TIME_BUDGET_S)
    assert plain.input_workers >= 1
    with pytest.raises(SystemExit):
        parse_args(["--rehearse", "--device", "cuda"])


def test_baselines_cuda_rows_are_llama3_8b_for_the_new_ops_decode_first():
    specs = [OPS[n] for n in OPS]
    bf16, fp16 = torch.bfloat16, torch.float16
    rows = plan_rows(specs, [bf16, fp16], engine=True, max_shapes=4)  # gpu_check's choice
    linear = [s for spec, s, d in rows if spec.name == "linear" and d == bf16]
    assert {s["tokens"] for s in linear} == {1, 8, 32, 2048} and len(linear) == 20
    assert {(s["n"], s["k"]) for s in linear} == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                                                  (128256, 4096)}  # qkv, o, gate_up, down, lm_head
    extend = [s for spec, s, d in rows if spec.name == "extend_attention" and d == bf16]
    assert all((s["batch"], s["q_heads"], s["kv_heads"], s["head_dim"]) == (4, 32, 8, 128) for s in extend)
    assert {(s["tokens"], s["prefix"]) for s in extend} == {(t, p) for t in (512, 2048, 8192) for p in (0, 2048)}
    for name in ("rmsnorm", "decode_attention"):  # the other ops: subsampled engine shapes
        assert len([1 for spec, _, d in rows if spec.name == name and d == bf16]) == 4
    assert all(s in list(spec.engine_shapes) for spec, s, _ in rows)
    assert len({(spec.name, tuple(s.items()), d) for spec, s, d in rows}) == len(rows)
    # dtype by dtype; decode before prefill; the tl.dot kernels first within each
    keys = [([bf16, fp16].index(d), not is_decode(s), gpu_order(list(OPS)).index(spec.name)) for spec, s, d in rows]
    assert keys == sorted(keys)
    after = gpu_order(list(OPS))[3]  # the first op after the tl.dot ones, in the op table's (name) order
    assert [spec.name for spec, s, _ in rows[:20]] == ["decode_attention"] * 4 + ["linear"] * 15 + [after]
    labels = [label for label, _ in groups(rows)]
    assert labels[:3] == ["decode_attention decode bfloat16", "linear decode bfloat16", f"{after} decode bfloat16"]
    assert "linear prefill bfloat16" in labels and sum(len(m) for _, m in groups(rows)) == len(rows)


def test_baselines_quick_rows_are_test_shapes():
    rows = plan_rows([OPS["linear"], OPS["rmsnorm"]], [torch.bfloat16], engine=False, max_shapes=2)
    assert [(spec.name, s) for spec, s, _ in rows] == [
        ("linear", OPS["linear"].test_shapes[0]), ("linear", OPS["linear"].test_shapes[-1]),
        ("rmsnorm", OPS["rmsnorm"].test_shapes[0]), ("rmsnorm", OPS["rmsnorm"].test_shapes[-1])]


def test_tune_gpu_plans_fit_the_step():
    gpu, cpu = tune_gpu.PLANS[CUDA], tune_gpu.PLANS[CPU]
    assert gpu.ops == "rmsnorm" and gpu.candidates == 3 and gpu.profile_requests <= 8
    assert gpu.sandbox_rounds is None  # the GPU judges with the sandbox's own rounds
    assert cpu.ops == "rmsnorm" and cpu.candidates <= 2 and cpu.sandbox_timeout_s > gpu.sandbox_timeout_s
    assert cpu.model["num_hidden_layers"] <= 2  # bench.rehearse's tiny Llama


def test_tune_gpu_context_sets_the_plans_sandbox_rounds(monkeypatch):
    seen: list[CheckOptions] = []
    monkeypatch.setattr(tune_gpu.LoopContext, "sandbox", lambda self, options: seen.append(options))
    ctx = tune_gpu.BenchContext(history=None, registry=None, proposers={}, sandbox_rounds=3)
    ctx.sandbox(CheckOptions(device="cpu"))
    ctx.sandbox(CheckOptions(device="cpu", rounds=9))  # a caller's own choice stands
    tune_gpu.BenchContext(history=None, registry=None, proposers={}).sandbox(CheckOptions(device="cpu"))
    assert [o.rounds for o in seen] == [3, 9, None]


# -- partial reports --------------------------------------------------------------------------------

def test_sandbox_cases_write_a_partial_report_after_each_case():
    cases = list(sandbox_gpu.CASES[:3])
    statuses: list[str] = []
    rows: list[dict] = []

    def judge(case):
        if case is cases[1]:
            raise RuntimeError("no confinement here")
        return verdict(correct=True), "pass", True

    ok = sandbox_gpu.run_cases(cases, judge, rows, lambda status: statuses.append((status, len(rows))))
    assert not ok
    assert [s.startswith("PARTIAL") for s, _ in statuses] == [True, True, False]
    assert [n for _, n in statuses] == [1, 2, 3]  # each report holds every row so far
    assert "1 of 3" in statuses[0][0] and statuses[-1][0] == ""
    assert [r["check"] for r in rows] == ["ok", "FAILED", "ok"]
    assert "RuntimeError: no confinement here" in rows[1]["verdict"]


def test_tune_ops_write_a_partial_report_after_each_op():
    statuses: list[str] = []
    rows: list[dict] = []

    def tune_one(op):
        if op == "silu_mul":
            raise ValueError("boom")
        return {"op": op, "result": "no-winner", "correct candidates": 1}

    tune_gpu.tune_ops(["decode_attention", "silu_mul", "rmsnorm"], tune_one, rows, statuses.append)
    assert [s.startswith("PARTIAL") for s in statuses] == [True, True, False]
    assert "stopped after decode_attention" in statuses[0]
    assert rows[1]["result"].startswith("error: ValueError: boom") and not tune_gpu.passed(rows)
    assert tune_gpu.passed([rows[0], rows[2]])


def test_tune_pass_rule():
    assert tune_gpu.passed([{"result": "winner"}, {"result": "no-winner", "correct candidates": 2}])
    assert not tune_gpu.passed([{"result": "no-winner", "correct candidates": 0}])
    assert not tune_gpu.passed([{"result": "gate-failed", "correct candidates": 3}])
    assert not tune_gpu.passed([])


# -- the sandbox step's cases -----------------------------------------------------------------------

def test_sandbox_cases_need_one_sandbox_per_timing_shape(monkeypatch):
    cases = sandbox_gpu.grouped(sandbox_gpu.CASES)
    assert sorted(c.name + c.op for c in cases) == sorted(c.name + c.op for c in sandbox_gpu.CASES)
    assert all(c.path.is_file() for c in cases)
    made: list[CheckOptions] = []

    class FakeSandbox:
        def __init__(self, options):
            made.append(options)

        def close(self):
            pass

    monkeypatch.setattr(sandbox_gpu, "Sandbox", FakeSandbox)
    pool = sandbox_gpu.Sandboxes(CPU)
    for case in cases:
        pool.get(case.small, case.dtype)
    pool.close()
    assert pool.started == len(made) == len({(c.small, c.dtype) for c in sandbox_gpu.CASES}) == 3
    assert all(not o.static_check and o.dtypes == (o.timing_dtype,) for o in made)
    assert sorted(o.dtypes for o in made) == [("bfloat16",), ("bfloat16",), ("float32",)]  # the float atomic race
    assert {None, tuple(sandbox_gpu.SMALL[CPU].items())} == {o.timing_shape and tuple(o.timing_shape.items())
                                                               for o in made}


def test_sandbox_case_rules_hold_on_cpu_and_cuda():
    by_name = {c.name: c for c in sandbox_gpu.CASES}
    side, cached = by_name["exploit: side stream"], by_name["exploit: cached result"]
    self_case, variant = by_name["baseline vs itself"], by_name["variant, decode shape"]
    for device in (CPU, CUDA):
        ok = sandbox_gpu.case_ok
        assert ok(side, verdict(failure="raised"), False, device)  # CPU: torch.cuda.Stream raises
        assert ok(side, verdict(correct=True, failure="not-faster"), False, device)
        assert not ok(side, verdict(correct=True, accepted=True), False, device)
        assert not ok(cached, verdict(correct=True, failure="not-faster"), True, device)
        assert ok(variant, verdict(correct=True, accepted=True), True, device)
        assert not ok(variant, verdict(correct=True), False, device)  # an honest case must pass the static check
        near = verdict(correct=True, failure="not-faster", speedup=1.0, speedup_interval=[0.97, 1.01])
        assert ok(self_case, near, True, device)
        far = verdict(correct=True, failure="not-faster", speedup=0.5, speedup_interval=[0.4, 0.6])
        assert not ok(self_case, far, True, device)
        assert not ok(self_case, verdict(correct=True, accepted=True, speedup_interval=[1.1, 1.2]), True, device)
    above = verdict(correct=True, failure="not-faster", speedup=1.02, speedup_interval=[1.01, 1.03])
    assert sandbox_gpu.case_ok(self_case, above, True, CPU)
    assert not sandbox_gpu.case_ok(self_case, above, True, CUDA)


def test_sandbox_l2_section_runs_on_cpu():
    rows, medians = sandbox_gpu.l2_rows(CPU)
    assert [r["case"] for r in rows] == [f"L2: {label}" for label, _ in sandbox_gpu.L2_FLUSHES]
    assert all(m > 0 for m in medians.values()) and len(medians) == 3
    assert "zero_()/read" in sandbox_gpu.l2_note(CPU, medians)


# -- kernels.timing's read-only flush -------------------------------------------------------------

@pytest.mark.parametrize("flush", [True, False, "write", "read"])
def test_time_calls_accepts_every_flush_kind_on_cpu(flush):
    calls = []
    samples = timing.time_calls(lambda: calls.append(1), CPU, warmup=1, reps=3, flush_l2=flush)
    assert len(samples) == 3 and len(calls) == 4


def test_flush_kinds():
    assert [timing.flush_kind(v) for v in (True, "write", "read", False, None)] == ["read", "write", "read",
                                                                                     None, None]
    for bad in ("both", 1, "READ"):
        with pytest.raises(ValueError):
            timing.flush_kind(bad)
    with pytest.raises(ValueError):  # refused on CPU too, before anything runs
        timing.time_calls(lambda: None, CPU, warmup=0, reps=1, flush_l2="both")


def test_read_flush_reads_without_writing(monkeypatch):
    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 1 << 16)
    monkeypatch.setattr(timing, "_flush_buffers", {})
    monkeypatch.setattr(timing, "_flush_sinks", {})
    dev = torch.device("cpu")
    assert timing.l2_flusher(dev, False) is None
    read = timing.l2_flusher(dev, "read")
    buf = timing._flush_buffers[dev]
    buf.fill_(1)
    before = buf.clone()
    read()
    assert torch.equal(buf, before)  # nothing written
    assert torch.equal(timing._flush_sinks[dev], before.view(torch.int64).sum())  # into the one-element sink
    timing.l2_flusher(dev, "write")()
    assert int(buf.sum()) == 0


@pytest.mark.gpu
def test_read_flush_times_on_cuda():
    spec = OPS["rmsnorm"]
    args = spec.make_inputs({"tokens": 64, "hidden": 4096}, torch.bfloat16, 0, "cuda")
    for flush in ("read", "write", False):
        samples = timing.time_calls(lambda: spec.forward(*args), CUDA, warmup=2, reps=5, flush_l2=flush)
        assert len(samples) == 5 and all(0 < s < 0.05 for s in samples)


def test_a_sandbox_that_cannot_start_is_one_failure_said_whole(tmp_path, monkeypatch, capsys):
    """Where confinement or CUDA inside it fails, no case can say anything: one FAILED row, and the reason
    printed and in the report's notes whole (the H200's CUDA error was lost to a table cell's width)."""
    reason = "CUDA does not work in a confined process on this machine (RuntimeError: " + "x" * 300 + " Error 304)"

    class Unavailable:
        def __init__(self, options):  # noqa: ANN001
            raise sandbox_gpu.SandboxUnavailable(reason)

    monkeypatch.setattr(sandbox_gpu, "Sandbox", Unavailable)
    monkeypatch.setattr(sandbox_gpu, "l2_rows", lambda device: ([], {}))
    assert sandbox_gpu.main(["--rehearse", "--out-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert reason in out and "checks FAILED" in out
    [md] = tmp_path.glob("*sandbox-gpu.md")
    assert reason in md.read_text() and "| the sandbox itself |" in md.read_text()
