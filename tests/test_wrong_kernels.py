"""Planted wrong kernels: the checks that pass every baseline must catch each of these."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernelloop.kernels import OPS
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.ops import decode_attention, fused_add_rmsnorm, rmsnorm, rope, silu_mul


@triton.jit
def _rmsnorm_mean_over_block(x_ptr, w_ptr, y_ptr, stride, n_cols, eps, BLOCK_N: tl.constexpr):
    # Bug: divides by the padded block instead of n_cols; right only when N is a power of two.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK_N + eps) * w
    tl.store(y_ptr + row * stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def wrong_rmsnorm(x, weight, eps):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _rmsnorm_mean_over_block[(x2.shape[0],)](x2, weight, y, x2.stride(0), x2.shape[1], eps,
                                             BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)


@triton.jit
def _silu_mul_floor_grid(x_ptr, y_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * d + cols, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=mask)


def wrong_silu_mul(x):
    # Bug: floor instead of ceil division in the grid; the ragged tail is never written.
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d).contiguous()
    y = torch.zeros(x2.shape[0], d, dtype=x.dtype)
    block = 32
    grid = (x2.shape[0], max(1, d // block))
    _silu_mul_floor_grid[grid](x2, y, d, BLOCK=block)
    return y.view(*x.shape[:-1], d)


def wrong_fused_add_rmsnorm(x, residual, weight, eps):
    # Bug: normalises x instead of x + residual.
    y, _ = fused_add_rmsnorm.forward(x, torch.zeros_like(residual), weight, eps)
    return y, (x.float() + residual.float()).to(x.dtype)


def wrong_rope(q, k, positions, cos_sin_cache):
    # Bug: rotates the wrong way (sin sign flipped).
    half = cos_sin_cache.shape[-1] // 2
    flipped = torch.cat([cos_sin_cache[:, :half], -cos_sin_cache[:, half:]], dim=-1)
    return rope.forward(q, k, positions, flipped)


def wrong_decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):
    # Bug: off by one at the end of each request (its newest token is ignored).
    lengths = (kv_indptr[1:] - kv_indptr[:-1]).clamp(min=1) - 1
    keep = torch.cat([kv_indices[int(s):int(s) + int(n)] for s, n in zip(kv_indptr[:-1], lengths)])
    indptr = torch.zeros_like(kv_indptr)
    indptr[1:] = torch.cumsum(lengths, 0)
    return decode_attention.forward(q, k_buffer, v_buffer, indptr, keep, sm_scale)


WRONG = {
    "rmsnorm": wrong_rmsnorm,
    "silu_mul": wrong_silu_mul,
    "fused_add_rmsnorm": wrong_fused_add_rmsnorm,
    "rope": wrong_rope,
    "decode_attention": wrong_decode_attention,
}


@pytest.mark.parametrize("name", list(WRONG))
def test_planted_wrong_kernel_is_caught(name):
    spec = OPS[name]
    results = [check_impl(spec, WRONG[name], shape, dtype, 0) for shape in spec.test_shapes for dtype in spec.dtypes]
    failed = [r for r in results if not r.ok]
    assert failed, f"the wrong {name} passed every check"
    assert all("outside atol" in r.reason for r in failed)


def test_odd_shapes_are_what_catch_the_power_of_two_bug():
    spec = OPS["rmsnorm"]
    good = check_impl(spec, wrong_rmsnorm, {"tokens": 1, "hidden": 64}, torch.float32, 0)
    assert good.ok and good.tol_fraction <= 1
    bad = check_impl(spec, wrong_rmsnorm, {"tokens": 3, "hidden": 33}, torch.float32, 0)
    assert not bad.ok and "max abs err" in bad.reason and bad.tol_fraction > 1


def test_wrong_output_type_shape_and_exceptions_are_reported():
    spec = OPS["rmsnorm"]
    shape = {"tokens": 3, "hidden": 33}
    assert "expected a tensor" in check_impl(spec, lambda x, w, e: x.tolist(), shape, torch.float32, 0).reason
    assert "shape" in check_impl(spec, lambda x, w, e: rmsnorm.forward(x, w, e)[:2], shape, torch.float32, 0).reason
    assert "dtype" in check_impl(spec, lambda x, w, e: rmsnorm.forward(x, w, e).half(), shape, torch.float32, 0).reason
    nan = check_impl(spec, lambda x, w, e: torch.full_like(x, float("nan")), shape, torch.float32, 0)
    assert not nan.ok and "99/99" in nan.reason
    raised = check_impl(spec, lambda *a: 1 / 0, shape, torch.float32, 0)
    assert not raised.ok and "ZeroDivisionError" in raised.reason
    two = check_impl(OPS["silu_mul"], lambda x: (silu_mul.forward(x), x), {"tokens": 2, "d": 8}, torch.float32, 0)
    assert "returned 2 outputs, expected 1" in two.reason
