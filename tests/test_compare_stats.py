"""Statistics of the error (kernels/compare.py `error_stats`, bounds in `OpSpec.error_bounds`): an output
within the elementwise tolerance must also be unbiased (mean signed relative error, mean offset) and
not noisier than rounding allows (relative RMS), with bounds in units of the dtype's unit roundoff.

Correct rounding sits well inside the bounds; planted biases that pass the elementwise check (a scale
or an offset at a fraction of the tolerance, truncation instead of round to nearest) are `biased`,
in the comparison and in the judge's verdict. Planted kernels: tests/sandbox_candidates/n4_*.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelloop.kernels import OPS
from kernelloop.kernels.compare import as_tuple, check_outputs, error_stats, stat_limits
from kernelloop.kernels.device import CPU
from kernelloop.kernels.spec import DEFAULT_ERROR_BOUNDS, UNIT_ROUNDOFF
from kernelloop.sandbox.judge.decisions import add_check, judge_call
from kernelloop.sandbox.verdict import FAILURES, Verdict

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def test_each_statistic_reads_its_kind_of_error() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 128, generator=g, dtype=torch.float64).float()
    rms = ref.double().square().mean().sqrt().item()
    scaled = error_stats(ref * (1 + 1e-5), ref)
    assert scaled.bias == pytest.approx(1e-5, rel=0.05) and abs(scaled.offset) < 2e-6
    shifted = error_stats(ref + 3e-5, ref)
    assert shifted.offset == pytest.approx(3e-5 / rms, rel=0.02) and abs(shifted.bias) < 3e-6
    noise = 1e-4 * torch.randn(ref.shape, generator=g)
    noisy = error_stats(ref + noise, ref)
    assert noisy.rms == pytest.approx(1e-4 / rms, rel=0.05) and abs(noisy.bias) < 1e-5
    assert (noisy.n, noisy.rows) == (64 * 128, 64)


def test_non_finite_elements_are_left_to_the_elementwise_check_and_subnormals_round_in_steps() -> None:
    ref = torch.tensor([[1.0, float("inf"), -2.0, float("nan")]])
    stats = error_stats(torch.tensor([[1.0, float("inf"), -2.0, float("nan")]]), ref)
    assert (stats.n, stats.bias, stats.offset, stats.rms) == (2, 0.0, 0.0, 0.0)
    # fp16 subnormals (below 6.1e-5) are spaced 6e-8 apart: a step either way on an output of 1e-6 is
    # 6% of it, but two units of roundoff of the smallest normal, which magnitudes are floored at.
    tiny = torch.full((8, 64), 1e-6).half()
    signs = torch.randint(0, 2, tiny.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    stats = error_stats(tiny + signs * 2.0**-24, tiny)
    assert stats.rms == pytest.approx(2 * UNIT_ROUNDOFF[torch.float16], rel=0.01)
    mean_limit, rms_limit = stat_limits(DEFAULT_ERROR_BOUNDS[torch.float16], torch.float16, stats.rows)
    assert stats.rms <= rms_limit and abs(stats.offset) < mean_limit


def test_bounds_are_the_dtype_rounding_and_the_mean_shrinks_over_rows() -> None:
    for dtype in DTYPES:
        b = DEFAULT_ERROR_BOUNDS[dtype]
        u = UNIT_ROUNDOFF[dtype]
        one, many = stat_limits(b, dtype, 1), stat_limits(b, dtype, 10_000)
        assert one[0] == pytest.approx((b.bias + b.spread) * u) and many[0] == pytest.approx((b.bias + b.spread / 100) * u)
        assert one[1] == many[1] == pytest.approx(b.rms * u)
        tol = OPS["rmsnorm"].tolerance(dtype)
        assert many[0] < 0.3 * tol.rtol, "a bias of a third of rtol is refused over many rows"
    deep = OPS["linear"].scale_at(torch.float32, {"tokens": 1, "n": 64, "k": 28672})
    assert stat_limits(DEFAULT_ERROR_BOUNDS[torch.float32], torch.float32, 1, deep)[1] == pytest.approx(
        deep * DEFAULT_ERROR_BOUNDS[torch.float32].rms * UNIT_ROUNDOFF[torch.float32])


# --- Correct rounding passes; planted biases within the tolerance do not ------------------------------

def chop(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 to `dtype` by truncation toward zero (instead of round to nearest)."""
    if dtype == torch.bfloat16:
        return ((y.float().contiguous().view(torch.int32) >> 16) << 16).view(torch.float32).to(dtype)
    mantissa, exponent = torch.frexp(y.double())
    return torch.ldexp(torch.trunc(mantissa * 2.0**11) / 2.0**11, exponent.double()).to(dtype)


def most_rows(name: str) -> dict[str, int]:
    """The op's range shape with the most rows (TOKEN_BUDGET tokens, many requests)."""
    return max(OPS[name].range_shapes, key=lambda s: math.prod(v for k, v in s.items() if k not in ("head_dim", "hidden", "d",
                                                                                                  "n", "k", "kv_len", "prefix")))


def outputs(name: str, dtype: torch.dtype, seed: int) -> tuple[tuple, tuple, tuple]:
    """(expected, float32 value before its rounding, float64 value) of the op at its most rows."""
    spec = OPS[name]
    args = spec.make_inputs(most_rows(name), dtype, seed, "cpu")

    def widened(to: torch.dtype) -> tuple:
        return tuple(a.to(to) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    exact = as_tuple(spec.reference(*widened(torch.float64)))
    return as_tuple(spec.reference(*args)), as_tuple(spec.reference(*widened(torch.float32))), exact


PLANTED = {  # name: (how the float32 value is wrong, the dtypes where it stays within the tolerance)
    "scaled by 1 + 0.4 rtol": (lambda y, tol, dt: (y * (1 + 0.4 * tol.rtol)).to(dt), DTYPES),
    "offset by 0.5 atol": (lambda y, tol, dt: (y + 0.5 * tol.atol).to(dt), DTYPES),
    "truncated to the dtype": (lambda y, tol, dt: chop(y, dt), (torch.float16, torch.bfloat16)),
}
OPS_CHECKED = ("rmsnorm", "silu_mul", "linear", "rope", "decode_attention")


@pytest.mark.parametrize("name", OPS_CHECKED)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_correct_rounding_is_well_inside_and_planted_biases_are_refused(name: str, dtype: torch.dtype) -> None:
    spec = OPS[name]
    shape = most_rows(name)
    tol = spec.tolerance(dtype, shape)
    for seed in range(3):
        expected, value32, exact = outputs(name, dtype, seed)
        honest = tuple(e.to(dtype) for e in exact)  # computed otherwise (float64), rounded once
        c = check_outputs(spec, honest if len(honest) > 1 else honest[0], expected if len(expected) > 1 else expected[0],
                          dtype, shape=shape)
        assert c.ok and c.stats_fraction <= 0.25, (name, dtype, c)
    for label, (wrong, dtypes) in PLANTED.items():
        if dtype not in dtypes:
            continue
        got = tuple(wrong(v, tol, dtype) for v in value32)
        c = check_outputs(spec, got if len(got) > 1 else got[0], expected if len(expected) > 1 else expected[0], dtype,
                          shape=shape)
        assert c.tol_fraction <= 1, f"{label}: not within the elementwise tolerance ({c.tol_fraction:.2f})"
        assert not c.ok and c.biased, f"{name} {dtype} {label} passed: {c.stats}"
        assert "biased, though every element is within tolerance" in c.reason


# --- The judge: the failure code, its one-line reason, the statistics in every trial's check ---------

SHAPE = {"tokens": 300, "hidden": 24}
GOOD = {"launches": 1, "torch_ops": [], "violations": [], "devices": ["cpu"], "count": 1}
RECORD = {"entries": [], "outputs": [{"buf": 2}], "inputs": 2, "problem": None}


def _judge(outputs_of) -> Verdict:
    spec = OPS["rmsnorm"]
    args = spec.make_inputs(SHAPE, torch.bfloat16, 4, "cpu")
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    expected = spec.reference(*args)
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")
    where = "bfloat16 tokens=300,hidden=24"
    c = judge_call(v, spec, where, GOOD, RECORD, [outputs_of(args, expected)], [t.clone() for t in inputs], inputs,
                   expected, CPU, SHAPE)
    add_check(v, where, c)
    return v


def test_the_verdict_names_the_statistic_its_value_and_its_bound_and_every_check_shows_them() -> None:
    assert FAILURES.index("biased") == FAILURES.index("mismatch") + 1
    right = _judge(lambda args, expected: expected.clone())
    assert right.failure is None and right.checks[0].ok
    assert "of tolerance; error 0.00 of bounds: bias +0 (0.00) offset +0 (0.00) rms 0 (0.00)" in right.checks[0].detail
    wrong = _judge(lambda args, expected: chop(OPS["rmsnorm"].reference(*(
        a.float() if isinstance(a, torch.Tensor) else a for a in args)), torch.bfloat16))
    assert wrong.failure == "biased" and not wrong.correct and not wrong.checks[0].ok
    reason = wrong.reason
    assert "\n" not in reason and reason.startswith("bfloat16 tokens=300,hidden=24: mean signed relative error -")
    value, bound = (float(x) for x in (reason.split("error ")[1].split(" ")[0], reason.split("bound ")[1].split(" ")[0]))
    assert -3 * UNIT_ROUNDOFF[torch.bfloat16] < value < -bound < 0, reason
    assert "(bfloat16 u=0.00391)" in reason


def test_describe_carries_the_bounds_for_prompts() -> None:
    d = OPS["linear"].describe()
    assert d["error_bounds"]["bfloat16"] == {"bias": 0.1, "spread": 2.0, "rms": 3.0, "u": 2.0**-8}
    assert set(d["error_bounds"]) == set(d["tolerances"])
    assert math.isclose(d["error_bounds"]["float32"]["u"], 2.0**-24)
