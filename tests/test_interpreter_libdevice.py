"""The interpreter's libdevice integer, bit and Bessel functions against references written another way
(Python integers, bytes, struct, published values). The float functions: tests/test_interpreter_fidelity.py."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernelloop.kernels.interpreter_libdevice import extern_elementwise

INTS = np.array([0, 1, -1, 7, -7, 0x7FFFFF, 0x800000, 0xFFFFFF, 0x1234567, -0x1234567, 2**31 - 1, -2**31, 123456,
                 -98765], dtype=np.int32)


def call(symbol: str, *args: np.ndarray, out: type = np.int32) -> np.ndarray:
    return extern_elementwise(symbol, list(args), np.dtype(out), interp=None)


def _signed24(v: int) -> int:
    v &= 0xFFFFFF
    return v - (1 << 24) if v & 0x800000 else v


def _as_int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def test_mul24_multiplies_the_low_24_bits_and_keeps_the_low_32() -> None:
    a, b = INTS, INTS[::-1].copy()
    assert call("__nv_mul24", a, b).tolist() == [_as_int32(_signed24(int(x)) * _signed24(int(y))) for x, y in zip(a, b)]
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    got = call("__nv_umul24", ua, ub, out=np.uint32).tolist()
    assert got == [((int(x) & 0xFFFFFF) * (int(y) & 0xFFFFFF)) & 0xFFFFFFFF for x, y in zip(ua, ub)]


def test_brev_reverses_the_bits() -> None:
    assert call("__nv_brev", INTS).view(np.uint32).tolist() == [
        int(f"{int(v) & 0xFFFFFFFF:032b}"[::-1], 2) for v in INTS]
    wide = np.array([1, -1, 0x0123456789ABCDEF, -2], dtype=np.int64)
    assert call("__nv_brevll", wide, out=np.int64).view(np.uint64).tolist() == [
        int(f"{int(v) & (2**64 - 1):064b}"[::-1], 2) for v in wide]


def test_byte_perm_selects_bytes_of_y_x() -> None:
    x, y = INTS, INTS[::-1].copy()
    s = np.array([0x3210, 0x7654, 0x0123, 0x4567, 0x1111, 0x7531, 0xFFFF, 0x8888, 0x2604, 0x0000, 0x5140, 0x7777,
                  0x3333, 0x6420], dtype=np.int32)
    want = []
    for xi, yi, si in zip(x, y, s):
        b = struct.pack("<ii", int(xi), int(yi))
        want.append(struct.unpack("<i", bytes(b[(int(si) >> (4 * n)) & 7] for n in range(4)))[0])
    assert call("__nv_byte_perm", x, y, s).tolist() == want


def test_double_words_split_and_join() -> None:
    d = np.array([0.0, -0.0, 1.0, -2.5, math.pi, 1e-310, float("inf"), 6.02e23], dtype=np.float64)
    hi, lo = call("__nv_double2hiint", d), call("__nv_double2loint", d)
    assert [struct.unpack("<ii", struct.pack("<d", v))[::-1] for v in d] == list(zip(hi.tolist(), lo.tolist()))
    assert call("__nv_hiloint2double", hi, lo, out=np.float64).tobytes() == d.tobytes()


def test_rcp64h_is_the_reciprocal_of_the_upper_word_to_its_upper_word() -> None:
    x = np.array([1.0, 3.0, -7.25, 1e300, math.pi, 1.7e308, 2.0 ** -1030], dtype=np.float64)
    r = call("__nv_rcp64h", x, out=np.float64)
    assert not (r.view(np.uint64) & np.uint64(0xFFFFFFFF)).any()  # low word zero
    assert np.allclose(r[:5], 1 / x[:5], rtol=2.0 ** -19)
    assert r[5] == 0.0 and r[6] == math.inf  # a subnormal result flushed to 0; a subnormal input flushed, 1/0


@pytest.mark.parametrize("symbol, out", [("__nv_jn", np.float64), ("__nv_jnf", np.float32)])
def test_jn_matches_published_values_and_the_recurrence(symbol: str, out: type) -> None:
    n = np.array([5, 0, 3, 1, 10], dtype=np.int32)
    x = np.array([2.0, 1.0, -1.5, 0.5, 1.0], dtype=out)
    want = [0.00703962975587169, 0.765197686557967, -0.0609639511411396, 0.242268457674874, 2.63061512368745e-10]
    assert np.allclose(call(symbol, n, x, out=out), want, rtol=1e-12 if out == np.float64 else 1e-6, atol=0)
    k, v = np.full(6, 4, np.int32), np.linspace(0.5, 9.0, 6)  # J(k-1) + J(k+1) = 2k/x J(k)
    lhs = call("__nv_jn", k - 1, v, out=np.float64) + call("__nv_jn", k + 1, v, out=np.float64)
    assert np.allclose(lhs, 2 * 4 / v * call("__nv_jn", k, v, out=np.float64), rtol=1e-12, atol=1e-15)
    assert call("__nv_jn", np.zeros(6, np.int32), v, out=np.float64).tolist() == call("__nv_j0", v, out=np.float64).tolist()


def test_fixed_order_bessel_functions_match_published_values() -> None:
    x = np.array([1.0, 2.404825557695773])  # J0's first zero
    assert np.allclose(call("__nv_j0", x, out=np.float64), [0.765197686557967, 0.0], rtol=1e-13, atol=1e-15)
    one = np.array([1.0])
    got = [call(f"__nv_{f}", one, out=np.float64)[0] for f in ("j1", "y0", "y1")]
    assert np.allclose(got, [0.440050585744934, 0.088256964215677, -0.781212821300289], rtol=1e-13)


def test_yn_matches_published_values_and_its_domain() -> None:
    n = np.array([2, 0, 1, 3, 1, 2], dtype=np.int32)
    x = np.array([1.0, 2.0, 0.0, -1.0, float("inf"), float("nan")])
    got = call("__nv_yn", n, x, out=np.float64)
    assert np.allclose(got[:2], [-1.65068260681625, 0.510375672649745], rtol=1e-12)
    assert got[2] == -math.inf and math.isnan(got[3]) and got[4] == 0.0 and math.isnan(got[5])


@triton.jit
def _integer_kernel(n_ptr, x_ptr, a_ptr, j_ptr, m_ptr, p_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    n, x, a = tl.load(n_ptr + offs), tl.load(x_ptr + offs), tl.load(a_ptr + offs)
    tl.store(j_ptr + offs, libdevice.jn(n, x))
    tl.store(m_ptr + offs, libdevice.mul24(a, a))
    tl.store(p_ptr + offs, libdevice.byte_perm(a, n, a))


def test_a_kernel_calls_them_through_the_interpreter() -> None:
    n = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    x = torch.tensor([2.0, 1.0, -1.5, 0.5])
    a = torch.tensor([0x1234567, -3, 0x7654, 99], dtype=torch.int32)
    j, m, p = torch.empty(4), torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
    _integer_kernel[(1,)](n, x, a, j, m, p, N=4)
    assert torch.allclose(j, torch.tensor([0.00703962975587169, 0.765197686557967, -0.0609639511411396,
                                           0.242268457674874]), rtol=1e-6)
    assert m.tolist() == call("__nv_mul24", a.numpy(), a.numpy()).tolist()
    assert p.tolist() == call("__nv_byte_perm", a.numpy(), n.numpy(), a.numpy()).tolist()
