"""numpy implementations of CUDA libdevice (`__nv_*`) functions for Triton's CPU interpreter.

Used by kernels/interpreter_fidelity.py: `extern_elementwise(symbol, args, out_dtype, interp)`
computes one libdevice call elementwise, in the arguments' precision (fp32 `...f` symbols in
float32, fp64 ones in float64). Approximate GPU variants (`__nv_fast_expf`, ...) are computed
exactly (`rcp64h` too: the reciprocal of x's upper 32 bits, kept to its upper 32 bits); symbols not
listed here (directed rounding `_rz/_ru/_rd` arithmetic) raise NotImplementedError.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import torch


def _torch(fn: Callable) -> Callable:
    """An elementwise torch function on numpy arrays (for what numpy lacks: erf, bessel, ...)."""
    return lambda *xs: fn(*(torch.from_numpy(np.ascontiguousarray(x)) for x in xs)).numpy()


def _vec(fn: Callable) -> Callable:
    """A Python scalar function applied elementwise, computed in float64."""
    return lambda *xs: np.vectorize(fn, otypes=[np.float64])(*(np.asarray(x, np.float64) for x in xs))


def _f64(fn: Callable) -> Callable:
    return lambda *xs: fn(*(np.asarray(x, np.float64) for x in xs))


def _round_half_away(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return t + np.where(np.abs(x - t) >= 0.5, np.sign(x), 0).astype(x.dtype)


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _bit_length(x: np.ndarray) -> np.ndarray:
    v = _unsigned(x).astype(np.uint64)
    n = np.zeros(v.shape, np.int32)
    for s in (32, 16, 8, 4, 2, 1):
        big = (v >> np.uint64(s)) != 0
        n += big.astype(np.int32) * s
        v = np.where(big, v >> np.uint64(s), v)
    return n + (v != 0)


def _clz(x: np.ndarray) -> np.ndarray:
    return x.dtype.itemsize * 8 - _bit_length(x)


def _ffs(x: np.ndarray) -> np.ndarray:
    u = _unsigned(x)
    return _bit_length(u & (~u + np.array(1, u.dtype)))


def _mulhi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    prod = (a.astype(object) * b.astype(object)) >> bits  # exact, Python ints
    mask = (1 << bits) - 1
    return np.array([int(p) & mask for p in prod.ravel()], dtype=_unsigned(a).dtype).view(a.dtype).reshape(a.shape)


def _fma(interp: Any) -> Callable:
    def fma(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        x, y, z = np.broadcast_arrays(x, y, z)
        f = interp._interpreter.fma_fp64 if z.dtype == np.float64 else interp._interpreter.fma_fp32
        return f(x, y, z)
    return fma


def _mul24(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The low 32 bits of the product of a's and b's low 24 bits (signed 24-bit values for int32)."""
    signed = a.dtype.kind == "i"

    def low24(v: np.ndarray) -> np.ndarray:
        v = v.astype(np.int64) & 0xFFFFFF
        return (v ^ 0x800000) - 0x800000 if signed else v

    return ((low24(a) * low24(b)) & 0xFFFFFFFF).astype(np.uint32).view(a.dtype)


def _brev(x: np.ndarray) -> np.ndarray:
    bits, u = x.dtype.itemsize * 8, _unsigned(np.ascontiguousarray(x)).astype(np.uint64)
    out = np.zeros(u.shape, np.uint64)
    for i in range(bits):
        out |= ((u >> np.uint64(i)) & np.uint64(1)) << np.uint64(bits - 1 - i)
    return out.astype(_unsigned(x).dtype).view(x.dtype)


def _byte_perm(x: np.ndarray, y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes y:x (x's bytes are 0-3)."""
    x, y, s = (_unsigned(np.ascontiguousarray(v)).astype(np.uint64) for v in np.broadcast_arrays(x, y, s))
    wide, out = (y << np.uint64(32)) | x, np.zeros(x.shape, np.uint64)
    for n in range(4):
        pick = (s >> np.uint64(4 * n)) & np.uint64(7)
        out |= ((wide >> (pick * np.uint64(8))) & np.uint64(0xFF)) << np.uint64(8 * n)
    return out.astype(np.uint32).view(np.int32)


def _upper_half(x: np.ndarray) -> np.ndarray:
    """A float64 with its low 32 bits cleared; subnormals flushed to a signed zero."""
    x = np.where(np.abs(x) < np.finfo(np.float64).tiny, np.copysign(0.0, x), x)
    return (np.ascontiguousarray(x).view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)


def _hiint(x: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(x, np.float64).view(np.int64) >> 32).astype(np.int32)


def _loint(x: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(x, np.float64).view(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def _hiloint(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    hi, lo = np.broadcast_arrays(hi, lo)
    low = np.ascontiguousarray(lo).view(np.uint32).astype(np.uint64)
    return ((np.ascontiguousarray(hi).astype(np.int64).view(np.uint64) << np.uint64(32)) | low).view(np.float64)


def _bessel_n(kind: str, order: int | None = None) -> Callable:
    """Bessel functions of integer order n (first kind "j", second "y"), through mpmath (sympy's, so torch's):
    torch's bessel_j0 is off by up to 1e-7 in float64. `order`: a fixed order (j0, y1, ...), else n is the
    first argument."""
    def one(n: float, x: float) -> float:
        import mpmath

        if math.isnan(x) or (kind == "y" and x < 0):
            return math.nan
        if math.isinf(x):
            return 0.0 if x > 0 or kind == "j" else math.nan
        return float((mpmath.besselj if kind == "j" else mpmath.bessely)(int(n), x))

    return _vec(one) if order is None else _vec(lambda x: one(order, x))


def _ilogb(x: np.ndarray) -> np.ndarray:
    return (np.frexp(x)[1] - 1).astype(np.int32)


_NORM = lambda *xs: np.sqrt(sum(np.asarray(x, np.float64) ** 2 for x in xs))  # noqa: E731

# Canonical names (no `__nv_` prefix, no fp32 `f` / fp64 `d` suffix, no `fast_` prefix).
_FUNCS: dict[str, Callable] = {
    # exponentials, logarithms, powers, roots
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(x.dtype.type(10), x), "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "pow": np.power, "powi": lambda x, n: np.power(x, n.astype(x.dtype)),
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "rcbrt": lambda x: 1 / np.cbrt(x),
    "fsqrt_rn": np.sqrt, "dsqrt_rn": np.sqrt, "frsqrt_rn": lambda x: 1 / np.sqrt(x),
    "frcp_rn": lambda x: 1 / x, "drcp_rn": lambda x: 1 / x, "rcp64h": lambda x: _upper_half(1 / _upper_half(x)),
    "hypot": np.hypot, "rhypot": lambda x, y: 1 / np.hypot(x, y),
    "norm3d": _NORM, "norm4d": _NORM,
    "rnorm3d": lambda *xs: 1 / _NORM(*xs), "rnorm4d": lambda *xs: 1 / _NORM(*xs),
    # trigonometric and hyperbolic
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "atan2": np.arctan2, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh,
    "sinpi": _f64(lambda x: np.sin(np.pi * x)), "cospi": _f64(lambda x: np.cos(np.pi * x)),
    # special functions
    "erf": _torch(torch.erf), "erfc": _torch(torch.erfc), "erfinv": _torch(torch.erfinv),
    "erfcinv": _torch(lambda x: torch.erfinv(1 - x)), "erfcx": _torch(torch.special.erfcx),
    "normcdf": _torch(torch.special.ndtr), "normcdfinv": _torch(torch.special.ndtri),
    "lgamma": _torch(torch.lgamma), "tgamma": _vec(math.gamma),
    "j0": _bessel_n("j", 0), "j1": _bessel_n("j", 1), "y0": _bessel_n("y", 0), "y1": _bessel_n("y", 1),
    "cyl_bessel_i0": _torch(torch.special.i0), "cyl_bessel_i1": _torch(torch.special.i1),
    "jn": _bessel_n("j"), "yn": _bessel_n("y"),
    # rounding, classification, arithmetic
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "round": _round_half_away,
    "rint": np.rint, "nearbyint": np.rint, "llrint": np.rint, "llround": _round_half_away,
    "fabs": np.abs, "copysign": np.copysign, "fmod": np.fmod, "remainder": _vec(math.remainder),
    "fdim": lambda x, y: np.where(x > y, x - y, np.zeros_like(x)), "nextafter": np.nextafter,
    "ldexp": lambda x, n: np.ldexp(x, n), "scalbn": lambda x, n: np.ldexp(x, n),
    "ilogb": _ilogb, "logb": lambda x: _ilogb(x).astype(x.dtype),
    "saturate": lambda x: np.where(np.isnan(x), 0, np.clip(x, 0, 1)).astype(x.dtype),
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "finite": np.isfinite, "signbit": np.signbit,
    "fadd_rn": np.add, "dadd_rn": np.add, "fsub_rn": np.subtract, "dsub_rn": np.subtract,
    "fmul_rn": np.multiply, "dmul_rn": np.multiply, "fdiv_rn": np.divide, "ddiv_rn": np.divide,
    "fdivide": np.divide,
    # bit reinterpretation (the output dtype is applied by extern_elementwise with a view)
    "float_as_int": None, "int_as_float": None, "float_as_uint": None, "uint_as_float": None,
    "double_as_longlong": None, "longlong_as_double": None,
    "double2hiint": _hiint, "double2loint": _loint, "hiloint2double": _hiloint,
    # integers
    "abs": np.abs, "llabs": np.abs, "popc": lambda x: np.bitwise_count(_unsigned(x)),
    "popcll": lambda x: np.bitwise_count(_unsigned(x)), "clz": _clz, "clzll": _clz, "ffs": _ffs, "ffsll": _ffs,
    "mulhi": _mulhi, "umulhi": _mulhi, "mul64hi": _mulhi, "umul64hi": _mulhi,
    "hadd": lambda a, b: (a.astype(np.int64) + b) >> 1, "uhadd": lambda a, b: (a.astype(np.uint64) + b) >> 1,
    "rhadd": lambda a, b: (a.astype(np.int64) + b + 1) >> 1,
    "urhadd": lambda a, b: (a.astype(np.uint64) + b + 1) >> 1,
    "sad": lambda a, b, c: np.abs(a.astype(np.int64) - b) + c,
    "usad": lambda a, b, c: np.abs(a.astype(np.int64) - b) + c,
    "mul24": _mul24, "umul24": _mul24, "brev": _brev, "brevll": _brev, "byte_perm": _byte_perm,
}
_FMA_NAMES = {"fma", "fmaf", "fma_rn", "fmaf_rn"}
# (float|double)2(int|uint|ll|ull)_<mode>, (int|uint|ll|ull)2(float|double)_rn, double2float_rn
_CONVERT = re.compile(r"(float|double|int|uint|ll|ull)2(int|uint|ll|ull|float|double)_(rn|rz|rd|ru)")
_ROUNDING = {"rn": np.rint, "rz": np.trunc, "rd": np.floor, "ru": np.ceil}


def _lookup(name: str) -> Callable | None:
    candidates = [name, name.removeprefix("fast_")]
    for cand in list(candidates):
        if cand[-1:] in ("f", "d"):
            candidates.append(cand[:-1])
    for cand in candidates:
        if cand in _FUNCS:
            return _FUNCS[cand]
    return None


def extern_elementwise(symbol: str, args: list[np.ndarray], out_dtype: np.dtype, interp: Any) -> np.ndarray:
    """Compute libdevice `symbol` on numpy `args`, returning an array of `out_dtype`."""
    name = symbol.removeprefix("__nv_")
    if name in _FMA_NAMES:
        return np.asarray(_fma(interp)(*args)).astype(out_dtype)
    if name in _FUNCS and _FUNCS[name] is None:  # bit reinterpretation
        return np.ascontiguousarray(args[0]).view(out_dtype)
    m = _CONVERT.fullmatch(name)
    if m:
        src_float = m.group(1) in ("float", "double")
        dst_float = m.group(2) in ("float", "double")
        if src_float and not dst_float:
            return _ROUNDING[m.group(3)](args[0]).astype(out_dtype)
        if m.group(3) == "rn":  # int->float and double->float: numpy rounds to nearest even
            return np.asarray(args[0]).astype(out_dtype)
    fn = _lookup(name)
    if fn is None:
        raise NotImplementedError(
            f"libdevice {symbol} has no implementation in the Triton interpreter (kernels/interpreter_libdevice.py)")
    with np.errstate(all="ignore"):  # a GPU returns inf/NaN silently
        out = np.asarray(fn(*args))
    return out.astype(out_dtype)
