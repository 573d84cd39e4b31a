"""Each op's correctness battery (`OpSpec.battery`, and the engine's ranges, `OpSpec.range_cases`): what
it contains, that every baseline passes it well inside its error bounds, that variant-free inputs never
change, and that wrong kernels only the variants or the ranges catch are caught. How the sandbox's plan
spreads it over devices and dtypes: tests/test_battery_plan.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernelloop.kernels import OPS
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.ops import decode_attention, rope, rope_kernel, silu_mul_kernel
from kernelloop.kernels.spec import REAL_HIDDEN, TOKEN_BUDGET, Case, pick_shapes

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # inf is expected there

BATTERY = [
    pytest.param(spec, dtype, id=f"{name}-{str(dtype)[6:]}") for name, spec in OPS.items() for dtype in spec.dtypes
]


@pytest.mark.parametrize("spec,dtype", BATTERY)
def test_baseline_passes_its_whole_cpu_battery(spec, dtype):
    results = [check_impl(spec, spec.forward, c.shape, dtype, 0, variant=c.variant) for c in spec.battery(CPU)]
    failed = [r for r in results if not r.ok]
    assert not failed, "\n".join(map(str, failed))
    # A correct kernel sits well inside the bounds on the error's statistics. float32's bounds are a few tens of
    # unit roundoffs, and the interpreter's libm (numpy's exp) differs by an ulp or two between CPUs.
    margin = 0.5 if dtype == torch.float32 else 0.25
    near = [f"{r} at {r.stats_fraction:.2f} of its error bounds" for r in results if r.stats_fraction > margin]
    assert not near, "\n".join(near)


def digest(spec) -> str:
    """sha256 over every input of the test shapes, all dtypes, seed 0 (bits, shapes, strides)."""
    h = hashlib.sha256()
    for shape in spec.test_shapes:
        for dtype in spec.dtypes:
            for seed in (0,):
                for a in spec.make_inputs(shape, dtype, seed, "cpu"):
                    if isinstance(a, torch.Tensor):
                        h.update(f"{a.dtype}{tuple(a.shape)}{a.stride()}".encode())
                        h.update(a.contiguous().view(torch.uint8).numpy().tobytes())
                    else:
                        h.update(repr(a).encode())
    return h.hexdigest()[:16]


# The inputs before variants existed (computed from the commit before them): engine benchmarks and
# recorded verdicts depend on them.
DEFAULT_INPUT_DIGESTS = {
    "rmsnorm": "c9d9582d23629cca",
    "fused_add_rmsnorm": "8e82b9ecb22d8dea",
    "silu_mul": "4339d6531db47497",
    "rope": "e01bf61400486b32",
    "decode_attention": "637138bdb69050ff",
    "extend_attention": "8962c3d9c1d5ec53",  # ops added after variants: digests from the commit adding them
    "linear": "ba40a77e77f650a0",
    "linear_int8": "522775594ac21c52",
    "linear_int4": "490f64693cc13545",
    "linear_fp8": "f9b5581bb30df664",
}


@pytest.mark.parametrize("name", list(OPS))
def test_default_inputs_are_unchanged_bit_for_bit(name):
    spec = OPS[name]
    assert digest(spec) == DEFAULT_INPUT_DIGESTS[name]
    shape = spec.test_shapes[-1]
    default = spec.make_inputs(shape, torch.bfloat16, 5, "cpu")
    for variant in (None, {}):
        for a, b in zip(default, spec.make_inputs(shape, torch.bfloat16, 5, "cpu", variant)):
            assert torch.equal(a, b) and a.stride() == b.stride() if isinstance(a, torch.Tensor) else a == b


def _has(spec, pred) -> bool:
    return any(pred(c) for c in spec.battery(CPU))


@pytest.mark.parametrize("name", list(OPS))
def test_battery_covers_the_contract(name):
    spec = OPS[name]
    cases = spec.battery(CPU)
    old = {json.dumps(s, sort_keys=True) for s in spec.test_shapes + spec.held_back}
    assert len(cases) == len({json.dumps([c.shape, c.variant], sort_keys=True) for c in cases}), "duplicates"
    assert all(isinstance(c, Case) for c in cases)
    json.dumps([[c.shape, c.variant] for c in cases])  # travels as JSON
    assert {json.dumps(c.shape, sort_keys=True) for c in cases if not c.variant} >= old
    keys = set(spec.test_shapes[0])
    assert all(set(c.shape) == keys for c in cases)
    rows = max(c.shape.get("tokens", c.shape.get("batch", 0)) for c in cases)
    assert rows > 16, "a many-rows shape on CPU"
    assert _has(spec, lambda c: 0 < c.variant.get("scale", 1) < 1), "a tiny-magnitude case"
    if name in ("rmsnorm", "fused_add_rmsnorm"):
        assert _has(spec, lambda c: c.variant.get("eps") == "seeded")
    if name == "decode_attention":
        assert _has(spec, lambda c: c.variant.get("sm_scale") == "seeded")
        assert _has(spec, lambda c: c.variant.get("lengths") == "empty")
    if name != "rope":  # a token of zeros is nothing special to a rotation
        assert _has(spec, lambda c: c.variant.get("zero_rows"))
    if name != "decode_attention":  # fixed layout
        assert _has(spec, lambda c: c.variant.get("layout") in ("strided", "qkv"))
    # The interpreter's cost per candidate: small batteries, larger for the cheapest ops per case (the
    # row-wise ops; linear's small GEMMs, quantized or not, are one numpy matmul per program).
    assert len(cases) <= (22 if name in ("rmsnorm", "fused_add_rmsnorm", "silu_mul") or name.startswith("linear")
                          else 14)


@pytest.mark.parametrize("name", list(OPS))
def test_cuda_battery_adds_engine_shapes_instead_of_many_rows(name):
    spec = OPS[name]
    cpu, cuda = spec.battery(CPU), spec.battery(CUDA)
    assert Case(dict(spec.many_rows)) in cpu and Case(dict(spec.many_rows)) not in cuda
    assert all(Case(dict(s)) in cuda for s in pick_shapes(spec.engine_shapes, 4))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """float8 (linear_fp8's weight) as its bytes: torch has no nan_to_num for it."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("name", list(OPS))
def test_variant_inputs_are_seeded_laid_out_and_invert_with_shape_of(name):
    spec = OPS[name]
    for shape in spec.variant_shapes:
        for variant in spec.variants:
            a = spec.make_inputs(shape, torch.float16, 3, "cpu", variant)
            b = spec.make_inputs(shape, torch.float16, 3, "cpu", dict(variant))
            for x, y in zip(a, b):
                if isinstance(x, torch.Tensor):
                    assert x.stride() == y.stride() and torch.equal(_bits(x).nan_to_num(), _bits(y).nan_to_num())
                    assert not (x.is_floating_point() and x.isnan().any()), "padding must stay outside the view"
                else:
                    assert x == y
            assert spec.shape_of(*a) == {k: v for k, v in shape.items() if k in spec.shape_of(*a)}
            if variant.get("layout") in ("strided", "qkv", "head_major"):
                assert not a[0].is_contiguous()
            if variant.get("layout") == "3d":
                assert a[0].dim() == 3
    with pytest.raises(ValueError, match="unknown input variant"):
        spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu", {"no_such_variant": True})


def test_seeded_scalars_vary_with_the_seed():
    eps = {OPS["rmsnorm"].make_inputs({"tokens": 2, "hidden": 8}, torch.float32, s, "cpu", {"eps": "seeded"})[2]
           for s in range(20)}
    assert len(eps) == 20 and 1e-6 <= min(eps) and max(eps) <= 1e-2 and max(eps) / min(eps) > 100
    shape = OPS["decode_attention"].variant_shapes[0]
    scales = {OPS["decode_attention"].make_inputs(shape, torch.float32, s, "cpu", {"sm_scale": "seeded"})[5]
              for s in range(5)}
    assert len(scales) == 5
    positions = OPS["rope"].make_inputs({"tokens": 9, "q_heads": 1, "kv_heads": 1, "head_dim": 8}, torch.float32,
                                        0, "cpu", {"positions": "spread"})[2]
    assert positions.max() == rope.DEFAULT_MAX_POS - 1 and (positions == 0).any() and positions.unique().numel() < 9


# --- Planted wrong kernels that pass the plain test shapes and only the battery's variants catch ------


@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, eps, extra, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps + extra) * w
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rms(x, weight, eps, *, rows_cap=None, row_stride=None, extra=0.0):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty((x2.shape[0], n), dtype=x.dtype)
    grid = (min(x2.shape[0], rows_cap or x2.shape[0]),)
    _rms_kernel[grid](x2, weight, y, x2.stride(0) if row_stride is None else row_stride, n, n, eps, extra,
                      BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


def silu_mul_ignoring_stride(x):
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    y = torch.empty((x2.shape[0], d), dtype=x.dtype)
    silu_mul_kernel._silu_mul_kernel[(x2.shape[0], triton.cdiv(d, 1024))](x2, y, 2 * d, d, d, BLOCK=1024)
    return y.view(*x.shape[:-1], d)


def rope_assuming_contiguous(q, k, positions, cache):
    t, hq, d = q.shape
    hk = k.shape[1]
    qo, ko = torch.empty((t, hq, d), dtype=q.dtype), torch.empty((t, hk, d), dtype=k.dtype)
    half = d // 2
    rope_kernel._rope_kernel[(t,)](q, k, qo, ko, positions, cache, hq * d, d, hk * d, d, hq * d, d, hk * d, d, d,
                                   hq, hk, half, BLOCK_H=triton.next_power_of_2(max(hq, hk)),
                                   BLOCK_HALF=triton.next_power_of_2(half))
    return qo, ko


def decode_attention_fixed_scale(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):
    return decode_attention.forward(q, k_buffer, v_buffer, kv_indptr, kv_indices, 1 / math.sqrt(q.shape[-1]))


WRONG = {
    "rmsnorm with eps fixed at 1e-6": ("rmsnorm", lambda x, w, eps: _rms(x, w, 1e-6), {"eps": "seeded"}),
    "rmsnorm that drops rows past 16": ("rmsnorm", lambda x, w, eps: _rms(x, w, eps, rows_cap=16), "many_rows"),
    "rmsnorm assuming contiguous rows": ("rmsnorm", lambda x, w, eps: _rms(x, w, eps, row_stride=x.shape[-1]),
                                         {"layout": "strided"}),
    "rmsnorm adding 1e-5 to the variance": ("rmsnorm", lambda x, w, eps: _rms(x, w, eps, extra=1e-5),
                                            {"scale": 1e-3}),
    "silu_mul ignoring the row stride": ("silu_mul", silu_mul_ignoring_stride, {"layout": "strided"}),
    "rope assuming contiguous q and k": ("rope", rope_assuming_contiguous, {"layout": "qkv"}),
    "decode_attention with sm_scale fixed": ("decode_attention", decode_attention_fixed_scale, {"sm_scale": "seeded"}),
}


@pytest.mark.parametrize("label", list(WRONG))
def test_wrong_kernel_passes_the_old_inputs_and_fails_the_new_battery(label):
    name, impl, catcher = WRONG[label]
    spec, dtype = OPS[name], torch.float32  # the tightest tolerance: passing it is passing
    old = [Case(dict(s)) for s in spec.test_shapes + spec.held_back]  # the plain shapes, no variants
    for c in old:
        r = check_impl(spec, impl, c.shape, dtype, 0, variant=c.variant)
        assert r.ok, f"{label} should pass the plain test shapes: {r}"
    battery = spec.battery(CPU)
    new = [c for c in battery if c not in old and (c.shape == spec.many_rows if catcher == "many_rows"
                                                   else c.variant == catcher)]
    assert new, f"no {catcher} case in the battery"
    results = [check_impl(spec, impl, c.shape, dtype, 0, variant=c.variant) for c in new]
    assert not all(r.ok for r in results), f"{label} passed every {catcher} case"


# --- The engine's ranges (OpSpec.range_shapes): judged on every device after the battery ------------

ROWS = {"rmsnorm": "tokens", "fused_add_rmsnorm": "tokens", "silu_mul": "tokens", "rope": "tokens",
        "linear": "tokens", "linear_int8": "tokens", "linear_int4": "tokens", "linear_fp8": "tokens",
        "extend_attention": "tokens", "decode_attention": "batch"}


def test_the_token_budget_is_the_schedulers():
    from kernelloop.engine.scheduler import SchedulerConfig

    assert SchedulerConfig().max_prefill_tokens == TOKEN_BUDGET


@pytest.mark.parametrize("name", list(OPS))
def test_range_shapes_reach_what_the_engine_sends(name):
    spec = OPS[name]
    shapes = spec.range_shapes
    assert shapes and all(set(s) == set(spec.test_shapes[0]) for s in shapes)
    assert spec.range_cases() == [Case(dict(s)) for s in shapes]
    most = max(s[ROWS[name]] for s in shapes)
    assert most >= 128 if name == "decode_attention" else most == TOKEN_BUDGET  # requests: past the default 32
    few = [s for s in shapes if s[ROWS[name]] <= 3]
    if name in ("rmsnorm", "fused_add_rmsnorm"):
        assert {s["hidden"] for s in few} == set(REAL_HIDDEN)
    if name == "silu_mul":
        assert {s["d"] for s in few} >= set(REAL_HIDDEN) | {28672}
    if name.startswith("linear"):
        assert max(s["k"] for s in few) == 28672 and max(s["n"] for s in few) >= 4096
    if name in ("rope", "decode_attention", "extend_attention"):  # real head layouts: SmolLM2's, llama's
        layouts = {(s["q_heads"], s["kv_heads"], s["head_dim"]) for s in shapes}
        assert (9, 3, 64) in layouts and any(q >= 32 and d >= 64 for q, _, d in layouts)
    if name == "decode_attention":  # one request of 2 * kv_len - 1 tokens
        assert max(s["batch"] * s["kv_len"] - s["batch"] + 1 for s in shapes if s["batch"] <= 2) > 2 * 4096 - 2
    if name == "extend_attention":  # a prefix of batch * prefix tokens, one request has it all
        assert max(s["batch"] * s["prefix"] for s in shapes if s["batch"] <= 2) >= 4096


def cpu_range_cases(spec) -> list[dict]:
    from kernelloop.sandbox.judge.plan import range_cases
    from kernelloop.sandbox.options import CheckOptions

    return [shape for shape, _ in range_cases(spec, CheckOptions(device="cpu"))]


@pytest.mark.parametrize("name", list(OPS))
def test_baseline_passes_the_range_cases_well_inside_its_error_bounds(name):
    """Each range case as the CPU plan runs it, in one dtype (~1-3 s a case: one program per row)."""
    spec = OPS[name]
    for i, shape in enumerate(cpu_range_cases(spec)):
        r = check_impl(spec, spec.forward, shape, spec.dtypes[i % len(spec.dtypes)], 0)
        assert r.ok and r.stats_fraction <= 0.25, f"{r} at {r.stats_fraction:.2f} of its error bounds"


CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
# Wrong only at the engine's ranges (tests/sandbox_candidates/n6_*.py): the range case that shows it on CPU.
RANGE_WRONG = {
    "n6_rmsnorm_persistent_past_1024_rows": ("rmsnorm", {"tokens": 1025, "hidden": 24}),
    "n6_silu_mul_block_capped_at_4096": ("silu_mul", {"tokens": 1, "d": 8192}),
    "n6_decode_attention_context_capped_at_4096": (
        "decode_attention", {"batch": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 16, "kv_len": 4096}),
}


@pytest.mark.parametrize("fixture", list(RANGE_WRONG))
def test_kernels_wrong_only_at_the_engines_ranges_pass_the_battery_and_fail_a_range_case(fixture):
    loader = importlib.util.spec_from_file_location(fixture, CANDIDATES / f"{fixture}.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    name, shape = RANGE_WRONG[fixture]
    spec = OPS[name]
    assert shape in cpu_range_cases(spec)
    old = [r for c in spec.battery(CPU)
           if not (r := check_impl(spec, module.forward, c.shape, torch.float32, 0, variant=c.variant)).ok]
    assert not old, f"{fixture} should pass the battery without the ranges:\n" + "\n".join(map(str, old))
    r = check_impl(spec, module.forward, shape, torch.float32, 0)
    assert not r.ok and "outside atol" in r.reason, str(r)
