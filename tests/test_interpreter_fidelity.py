"""The interpreter fidelity patch (kernels/interpreter_fidelity.py): GPU semantics on CPU.

Each fix is shown both ways: the raw interpreter (patch undone for the test) gets it wrong, the
patched one matches what compiled Triton computes (bf16 references: fp32 math, one RNE rounding
per op, as torch's bf16 ops do). Then the baseline ops and the other-project idiom controls in
tests/sandbox_candidates/control_idiom_*.py are checked directly with kernels.compare.check_impl.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import libdevice as cuda_libdevice
from triton.language.extra.libdevice import rsqrt as ld_rsqrt

from kernelloop.kernels import OPS
from kernelloop.kernels import interpreter_fidelity as fidelity
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.device import triton_interpreted

pytestmark = [
    pytest.mark.skipif(not triton_interpreted(), reason="checks Triton's CPU interpreter"),
    pytest.mark.skipif(os.environ.get("KERNELLOOP_INTERPRETER_FIDELITY") == "0", reason="fidelity patch off"),
]
CONTROLS = sorted((Path(__file__).parent / "sandbox_candidates").glob("control_idiom_*.py"))


@pytest.fixture
def raw():
    """Run a test body against the interpreter as Triton ships it, then patch it again."""
    if not fidelity.PATCHED:
        pytest.skip("the fidelity patch is off (KERNELLOOP_INTERPRETER_FIDELITY=0?)")
    fidelity._unpatch()
    try:
        yield
    finally:
        fidelity.patch_interpreter()
    assert fidelity.PATCHED


def _fails(fn) -> bool:
    """True if fn raises or returns False (what the raw interpreter does on these checks)."""
    try:
        return not fn()
    except Exception:
        return True


# ---- 1. float scalar arguments are fp32 tensors -------------------------------------------------

@triton.jit
def _scalar_args_kernel(x_ptr, y_ptr, info_ptr, eps, small, big, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x + eps.to(tl.float32))
    tl.store(info_ptr, eps.dtype == tl.float32)
    tl.store(info_ptr + 1, small.dtype == tl.int32)
    tl.store(info_ptr + 2, big.dtype == tl.int64)


def _scalar_args_ok() -> bool:
    x, y, info = torch.arange(8, dtype=torch.float32), torch.empty(8), torch.zeros(3, dtype=torch.int32)
    _scalar_args_kernel[(1,)](x, y, info, 0.1, 7, 2**40, N=8)
    return torch.equal(y, x + torch.tensor(0.1, dtype=torch.float32)) and info.tolist() == [1, 1, 1]


def test_float_args_are_fp32_scalars():
    assert _scalar_args_ok()


def test_float_args_raw_interpreter_fails(raw):
    assert _fails(_scalar_args_ok)


# ---- 2. libdevice -------------------------------------------------------------------------------

@triton.jit
def _libdevice_kernel(x_ptr, y_ptr, FN: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    if FN == "rsqrt":
        y = ld_rsqrt(x)  # `from triton.language.extra.libdevice import rsqrt`
    elif FN == "exp":
        y = libdevice.exp(x)
    elif FN == "exp2":
        y = libdevice.exp2(x)
    elif FN == "log":
        y = libdevice.log(x)
    elif FN == "sqrt":
        y = libdevice.sqrt(x)
    elif FN == "tanh":
        y = cuda_libdevice.tanh(x)
    elif FN == "erf":
        y = libdevice.erf(x)
    elif FN == "pow":
        y = libdevice.pow(x, x)
    elif FN == "fast_expf":
        y = libdevice.fast_expf(x)
    elif FN == "isnan":
        y = libdevice.isnan(x).to(x.dtype)
    else:
        y = tl.extra.cuda.libdevice.round(x)
    tl.store(y_ptr + offs, y)


LIBDEVICE = {
    "rsqrt": torch.rsqrt, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "sqrt": torch.sqrt,
    "tanh": torch.tanh, "erf": torch.erf, "pow": lambda x: x ** x, "fast_expf": torch.exp,
    "isnan": lambda x: x.isnan().to(x.dtype),
    "round": lambda x: (x.double().sign() * (x.double().abs() + 0.5).floor()).to(x.dtype),  # half away from 0
}


def _libdevice_ok(fn: str, dtype: torch.dtype) -> bool:
    if fn == "fast_expf" and dtype == torch.float64:
        return True  # fp32 only
    x = torch.linspace(0.05, 4.0, 32, dtype=dtype)
    if fn == "isnan":
        x[3] = float("nan")
    if fn == "round":
        x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 3.2] * 4, dtype=dtype)
    y = torch.empty_like(x)
    _libdevice_kernel[(1,)](x, y, FN=fn, N=32)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    return torch.allclose(y, LIBDEVICE[fn](x), rtol=tol, atol=tol) and y.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("fn", list(LIBDEVICE))
def test_libdevice_matches_torch(fn, dtype):
    assert _libdevice_ok(fn, dtype)


def test_libdevice_raw_interpreter_fails(raw):
    for fn in ("rsqrt", "exp", "tanh"):
        assert _fails(lambda: _libdevice_ok(fn, torch.float32)), fn  # noqa: B023


def test_unsupported_libdevice_names_the_symbol():
    @triton.jit
    def _rz(x_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        tl.store(x_ptr + offs, libdevice.add_rz(x, x))

    with pytest.raises(Exception, match="__nv_fadd_rz"):
        _rz[(1,)](torch.ones(4), N=4)


# ---- 3. bfloat16 --------------------------------------------------------------------------------

def _bf16(n: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * scale).bfloat16()


@triton.jit
def _bf16_elementwise_kernel(x_ptr, y_ptr, f_ptr, add_ptr, mul_ptr, misc_ptr, cast_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(add_ptr + offs, x + y)
    tl.store(mul_ptr + offs, x * y)
    tl.store(misc_ptr + offs, tl.where(x < y, -x, tl.maximum(x, y) - 1.5))
    tl.store(cast_ptr + offs, tl.load(f_ptr + offs).to(tl.bfloat16))  # fp32 -> bf16, RNE


def _bf16_elementwise_ok() -> bool:
    n = 64
    x, y = _bf16(n, 0), _bf16(n, 1)
    f = torch.randn(n, generator=torch.Generator().manual_seed(2)) * 5
    f[:4] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3.0e38])  # ties to even, overflow to inf
    add, mul, misc, cast = (torch.empty(n, dtype=torch.bfloat16) for _ in range(4))
    _bf16_elementwise_kernel[(1,)](x, y, f, add, mul, misc, cast, N=n)
    misc_ref = torch.where(x < y, -x, torch.maximum(x, y) - 1.5)
    return (torch.equal(add, x + y) and torch.equal(mul, x * y) and torch.equal(misc, misc_ref)
            and torch.equal(cast, f.bfloat16()))


@triton.jit
def _bf16_reduce_kernel(x_ptr, y_ptr, sum_ptr, max_ptr, argmax_ptr, ones_ptr, ones_sum_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    prod = x * tl.load(y_ptr + offs)  # bf16 arithmetic feeding the reductions
    tl.store(sum_ptr, tl.sum(prod, axis=0))  # bf16 sum
    tl.store(max_ptr, tl.max(prod, axis=0))
    tl.store(argmax_ptr, tl.argmax(x, axis=0))  # negative values: compared by value, not bits
    tl.store(ones_sum_ptr, tl.sum(tl.load(ones_ptr + offs), axis=0))


def _bf16_reduce_ok() -> bool:
    n = 1024
    x, y = _bf16(n, 3), _bf16(n, 4)
    x[17] = -100.0  # larger than every positive value as raw bits
    x[900] = 20.0
    ones = torch.ones(n, dtype=torch.bfloat16)
    s, m, o = (torch.empty(1, dtype=torch.bfloat16) for _ in range(3))
    am = torch.empty(1, dtype=torch.int32)
    _bf16_reduce_kernel[(1,)](x, y, s, m, am, ones, o, N=n)
    prod = x * y
    # bf16 partial sums, as on a GPU: each of the log2(n) tree levels rounds (unit roundoff 2^-8)
    bound = 10 * 2.0 ** -8 * prod.double().abs().sum().item()
    sum_ok = abs(s.double().item() - prod.double().sum().item()) <= bound
    return (sum_ok and m.item() == prod.max().item() and am.item() == 900
            and o.item() == 1024.0)  # a sequential bf16 sum would stall at 256


def test_bf16_elementwise_rounds_like_the_gpu():
    assert _bf16_elementwise_ok()


def test_bf16_reductions_give_the_gpu_answer():
    assert _bf16_reduce_ok()


def test_bf16_raw_interpreter_fails(raw):
    assert _fails(_bf16_elementwise_ok)
    assert _fails(_bf16_reduce_ok)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))  # bf16 operands, fp32 accumulator


def _bf16_dot_ok() -> bool:
    a, b = _bf16(16 * 32, 5).view(16, 32), _bf16(32 * 16, 6).view(32, 16)
    c = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, c, M=16, K=32, N=16)
    return torch.allclose(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


def test_bf16_dot_accumulates_in_fp32():
    assert _bf16_dot_ok()


def test_bf16_dot_raw_interpreter_fails(raw):
    assert _fails(_bf16_dot_ok)


@triton.jit
def _fp32_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PRECISION: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    if PRECISION == "default":
        c = tl.dot(a, b)  # Triton's default for fp32 operands: tf32
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + m[:, None] * N + n[None, :], c)


def _fp32_dot(precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    c = torch.empty(16, 16)
    _fp32_dot_kernel[(1,)](a, b, c, M=16, K=64, N=16, PRECISION=precision)
    return a, b, c


def _tf32(t: torch.Tensor) -> torch.Tensor:  # round to nearest, ties away, 10 mantissa bits
    bits = t.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("precision", ["default", "tf32"])
def test_fp32_dot_under_tf32_rounds_the_operands_as_tensor_cores_do(precision):
    a, b, c = _fp32_dot(precision)
    exact = a.double() @ b.double()
    torch.testing.assert_close(c.double(), _tf32(a).double() @ _tf32(b).double(), rtol=1e-6, atol=1e-5)
    assert (c.double() - exact).abs().max() > 1e-3  # visibly not fp32: the float32 tolerance catches it


def test_fp32_dot_under_ieee_is_fp32():
    a, b, c = _fp32_dot("ieee")
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


def test_tf32_rounding_keeps_inf_and_nan():
    import numpy as np

    from kernelloop.kernels.interpreter_fidelity import _f32_to_tf32

    x = np.array([np.inf, -np.inf, np.nan, np.finfo(np.float32).max, 1.0 + 2 ** -11, 1.0 + 2 ** -12], dtype=np.float32)
    y = _f32_to_tf32(x)
    assert np.isinf(y[0]) and np.isinf(y[1]) and np.isnan(y[2]) and np.isinf(y[3])
    assert y[4] == np.float32(1.0 + 2 ** -10) and y[5] == np.float32(1.0)  # tie away from zero; below half: down


def test_fp32_dot_raw_interpreter_is_exact(raw):
    a, b, c = _fp32_dot("default")
    assert _fails(lambda: (c.double() - a.double() @ b.double()).abs().max() > 1e-3)


# ---- the patch itself ---------------------------------------------------------------------------

def test_patch_is_idempotent():
    from triton.runtime import interpreter

    before = interpreter.InterpreterBuilder.binary_op
    fidelity.patch_interpreter()
    fidelity.patch_interpreter()
    assert interpreter.InterpreterBuilder.binary_op is before and fidelity.PATCHED


def test_no_op_when_not_interpreting_or_switched_off(raw, monkeypatch):
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.binary_op
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fidelity.patch_interpreter()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KERNELLOOP_INTERPRETER_FIDELITY", "0")
    fidelity.patch_interpreter()
    assert not fidelity.PATCHED and interpreter.InterpreterBuilder.binary_op is original
    monkeypatch.undo()


def test_unexpected_internals_warn_once_and_leave_triton_alone(raw, monkeypatch, caplog):
    from triton.runtime import interpreter

    monkeypatch.setitem(fidelity._EXPECTED, ("InterpreterBuilder", "binary_op"), ["self", "renamed"])
    monkeypatch.setattr(fidelity, "_WARNED", False)
    original = interpreter.InterpreterBuilder.binary_op
    with caplog.at_level(logging.WARNING, logger=fidelity.__name__):
        fidelity.patch_interpreter()
        fidelity.patch_interpreter()
    assert not fidelity.PATCHED and interpreter.InterpreterBuilder.binary_op is original
    assert len([r for r in caplog.records if "unpatched" in r.getMessage()]) == 1
    monkeypatch.undo()  # let the fixture patch again with the real expectations


# ---- ops and controls ---------------------------------------------------------------------------

BASELINE_CASES = [
    pytest.param(spec, shape, dtype, id=f"{name}-{i}-{str(dtype)[6:]}")
    for name, spec in OPS.items() for i, shape in enumerate(spec.test_shapes[:2]) for dtype in spec.dtypes
]


@pytest.mark.parametrize("spec,shape,dtype", BASELINE_CASES)
def test_baseline_ops_still_pass(spec, shape, dtype):
    result = check_impl(spec, spec.forward, shape, dtype, seed=0)
    assert result.ok, str(result)


def _load_control(path: Path):
    text = path.read_text()
    assert re.search(r"^# expect: control$", text, re.M), f"{path.name}: not marked `# expect: control`"
    op = re.search(r"^# op:\s*(\w+)\s*$", text, re.M).group(1)
    module_spec = importlib.util.spec_from_file_location(f"control_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert module.__doc__ and "idiom" in module.__doc__
    return OPS[op], module


def test_there_are_idiom_controls():
    assert len(CONTROLS) >= 4


@pytest.mark.parametrize("path", CONTROLS, ids=[p.stem for p in CONTROLS])
def test_idiom_controls_are_correct(path):
    spec, module = _load_control(path)
    failures = [str(r) for shape in spec.test_shapes for dtype in spec.dtypes for seed in (0, 1)
                if not (r := check_impl(spec, module.forward, shape, dtype, seed)).ok]
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize("name", ["control_idiom_liger_rmsnorm", "control_idiom_flaggems_silu_mul"])
def test_idiom_controls_fail_on_the_raw_interpreter(name, raw):
    spec, module = _load_control(Path(__file__).parent / "sandbox_candidates" / f"{name}.py")
    assert not check_impl(spec, module.forward, spec.test_shapes[0], torch.float32, 0).ok
