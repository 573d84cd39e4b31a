"""How the sandbox's plan (sandbox/judge/plan.py) spreads each op's battery: the CUDA plan's cap on trials,
the engine's range cases last (one dtype each on CPU, every dtype on CUDA), the secret rotation of dtypes,
and timing in a dtype the candidate is judged in. The battery itself: tests/test_battery.py."""

from __future__ import annotations

import pytest
import torch

from kernelloop.kernels import OPS
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.spec import TOKEN_BUDGET, pick_shapes

from tests.test_battery import ROWS, cpu_range_cases

# -- the CUDA plan's cap (sandbox/judge/plan.py): inputs and references are computed on the judge's CPU ---

@pytest.mark.parametrize("name", list(OPS))
def test_cuda_plan_stays_within_the_trial_limit_and_keeps_its_engine_shapes(name):
    from kernelloop.sandbox.judge.plan import CUDA_TRIAL_LIMIT, check_cases, make_plan, within_trial_limit
    from kernelloop.sandbox.options import CheckOptions

    spec = OPS[name]
    plan = make_plan(spec, CheckOptions(device="cuda"), 1)
    for shape in [t["shape"] for t in plan["trials"]] + [plan["timing"]["shape"]]:
        cost = spec.cost(shape, torch.float32)
        assert cost.bytes <= CUDA_TRIAL_LIMIT.bytes and cost.flops <= CUDA_TRIAL_LIMIT.flops, shape
    engine = [s for s, v in check_cases(spec, CheckOptions(device="cuda")) if s in list(spec.engine_shapes)]
    assert len(engine) == 4 and all(within_trial_limit(spec, s) for s in engine)
    assert len({s.get("tokens", s.get("batch")) for s in engine}) >= 2  # still decode to prefill
    picked = pick_shapes(spec.engine_shapes, 4)
    if all(within_trial_limit(spec, s) for s in picked):  # nothing to cap: the battery's own picks
        assert engine == picked
        assert plan["timing"]["shape"] == pick_shapes(spec.engine_shapes, 3)[1]


def test_cuda_plan_caps_the_new_ops_only():
    from kernelloop.sandbox.judge.plan import check_cases, within_trial_limit
    from kernelloop.sandbox.options import CheckOptions

    capped = {n for n, spec in OPS.items() if not all(within_trial_limit(spec, s)
                                                      for s in pick_shapes(spec.engine_shapes, 4))}
    assert capped == {"linear", "linear_int8", "linear_int4", "linear_fp8", "extend_attention"}
    shapes = [s for s, _ in check_cases(OPS["linear"], CheckOptions(device="cuda"))]
    assert {"tokens": 8192, "n": 128256, "k": 8192} not in shapes  # 17 TFLOPs on the judge's CPU
    caller = {"tokens": 2048, "n": 128256, "k": 4096}  # what a caller asks for is checked as asked
    assert caller in [s for s, _ in check_cases(OPS["linear"], CheckOptions(device="cuda", shapes=(caller,)))]


# --- The plan: range cases last, one dtype each on CPU; the rotation is secret; timing's dtype --------

@pytest.mark.parametrize("name", list(OPS))
def test_the_plan_judges_each_range_case_last_once_on_cpu_and_in_every_dtype_on_cuda(name):
    from kernelloop.sandbox.judge.plan import make_plan
    from kernelloop.sandbox.options import CheckOptions

    spec = OPS[name]
    ranges = cpu_range_cases(spec)
    cpu = make_plan(spec, CheckOptions(device="cpu"), 5)["trials"]
    if ROWS[name] == "tokens":  # the plan reaches exactly the rows the engine may send a CPU registry kernel
        assert max(t["shape"]["tokens"] for t in cpu) == spec.judged_tokens(CPU) <= 1025
        assert spec.judged_tokens(CUDA) == TOKEN_BUDGET
    tail = cpu[-len(ranges):]
    assert [t["shape"] for t in tail] == ranges and not any(t["shape"] in ranges for t in cpu[:-len(ranges)])
    assert not any(t["determinism"] for t in tail)  # the replay still compares their bits
    cuda = make_plan(spec, CheckOptions(device="cuda"), 5)["trials"]
    for shape in spec.range_shapes:  # (a range shape among the CUDA battery's engine picks is judged there, once a dtype)
        assert sorted(t["dtype"] for t in cuda if t["shape"] == shape and not t["variant"]) == sorted(
            str(d)[6:] for d in spec.dtypes)


def test_which_dtype_a_rotating_case_lands_in_is_drawn_from_the_secret_seed():
    from kernelloop.sandbox.judge.plan import make_plan
    from kernelloop.sandbox.options import CheckOptions

    spec = OPS["rmsnorm"]
    big = {"tokens": 1025, "hidden": 24}
    landed = {next(t["dtype"] for t in make_plan(spec, CheckOptions(device="cpu"), seed)["trials"] if t["shape"] == big)
              for seed in range(12)}
    assert len(landed) == 3


def test_a_candidate_is_timed_in_a_dtype_it_is_judged_in():
    from kernelloop.common.errors import UnknownDtypeError
    from kernelloop.sandbox.judge.plan import make_plan
    from kernelloop.sandbox.options import CheckOptions

    spec = OPS["rmsnorm"]
    for device, dtypes in (("cpu", ("bfloat16", "float16")), ("cpu", ("bfloat16",)), ("cuda", ("float32",))):
        plan = make_plan(spec, CheckOptions(device=device, dtypes=dtypes), 1)
        assert plan["timing"]["dtype"] in dtypes and {t["dtype"] for t in plan["trials"]} == set(dtypes)
    assert make_plan(spec, CheckOptions(device="cpu"), 1)["timing"]["dtype"] == "float32"
    assert make_plan(spec, CheckOptions(device="cuda"), 1)["timing"]["dtype"] == "bfloat16"
    with pytest.raises(UnknownDtypeError, match="timing dtype float32 is not among the dtypes judged"):
        make_plan(spec, CheckOptions(dtypes=("bfloat16",), timing_dtype="float32"), 1)


def test_dtypes_given_to_the_judge_are_the_dtypes_it_times(tmp_path):
    """A linear kernel at Triton's default dot precision (TF32: wrong in float32), checked in the half
    dtypes it is meant for, is correct and timed in one of them, not refused in a float32 timing round."""
    from kernelloop.kernels.ops import baseline_source
    from kernelloop.sandbox import CheckOptions, Sandbox

    source = baseline_source("linear")
    ieee = 'precision = "ieee" if x.dtype == torch.float32 else "tf32"'
    assert ieee in source
    source = source.replace(ieee, 'precision = "tf32"')
    opts = CheckOptions(device="cpu", registry=tmp_path / "registry", dtypes=("bfloat16", "float16"), rounds=2,
                        seed=3, timeout_s=300)
    with Sandbox(opts) as sandbox:
        v = sandbox.judge_source("linear", source, "linear_tf32.py")
    assert v.correct, v.reason
    assert v.timing["dtype"] in ("bfloat16", "float16") and v.failure in (None, "not-faster"), v.reason
    assert {c.name.split()[0] for c in v.checks} <= {"bfloat16", "float16"}
