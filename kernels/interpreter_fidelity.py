"""Make Triton's CPU interpreter compute what compiled Triton computes on an NVIDIA GPU.

Kernels written for a GPU (the Liger-Kernel / SGLang / FlagGems / Unsloth way) hit interpreter
gaps that have nothing to do with their merit. `patch_interpreter()` closes these, by wrapping
specific members of `triton.runtime.interpreter` (Triton 3.x; checked by name and signature):

* Scalar arguments: `_implicit_cvt` turns a Python float argument into an fp32 scalar tensor, as
  the compiled launcher passes it (so `eps.to(tl.float32)`, `eps.dtype` work, and `x_bf16 * eps`
  promotes to fp32 as on a GPU). Ints keep the interpreter's i32/i64 mapping.
* libdevice: the functions of `triton.language.extra.cuda.libdevice` (and the placeholders of
  `triton.language.extra.libdevice`, mapped to the CUDA ones as the compiler's module_map does)
  are replaced by versions bound to the interpreter; `_patch_lang` rebinds, for each launch, the
  names a kernel's module imported with `from ... import`; `InterpreterBuilder.
  create_extern_elementwise` computes the `__nv_*` symbol (kernels/interpreter_libdevice.py) with
  numpy (torch for erfinv, bessel, ...) in the arguments' precision (fp32 or fp64).
* bfloat16 (stored as uint16 bits by the interpreter): `InterpreterBuilder.cast_impl` converts
  to/from bf16 with round-to-nearest-even (loads/stores/`.to()`/constants all go through it);
  `binary_op`, `unary_op`, `create_fma`, `create_clampf` compute bf16 operands in fp32 and round
  each result back (what compiled Triton does per op); comparisons return int1.
  `create_dot` multiplies bf16 blocks with fp32 accumulation, and rounds fp32 operands to TF32
  (10 mantissa bits, round to nearest, ties away, as cvt.rna.tf32.f32) when input_precision is tf32,
  Triton's default: a kernel that leaves fp32 dots at the default loses precision on CPU as it would
  on a GPU, so the float32 tolerance catches it before any GPU time; `ReduceOps.sum` (bf16 and fp16)
  adds pairwise in a tree, rounding every partial sum to the input dtype as a GPU reduction does;
  `ReduceOps.min_max` (max/min/argmax/argmin) compares bf16 by value; `ScanOps.cumsum/cumprod`
  (bf16, fp16) round every step.

* `@triton.autotune` with several configs (Triton times them with the GPU driver's benchmarker): a
  config is chosen without timing, deterministically, and the sandbox can pin one per call
  (kernels/interpreter_autotune.py).

Still different from compiled Triton (documented in docs/interpreter.md):
* tl.dot: fp32 inputs under tf32x3/bf16x3/bf16x6 are multiplied in full fp32 (a GPU's split
  products come within a few fp32 ulps), accumulation order is BLAS's, fp8 dots go through fp16,
  and max_num_imprecise_acc is ignored.
* Summation order of reductions is a pairwise tree, not the GPU's per-thread / warp-shuffle order.
* libdevice approximations (`fast_expf`, `fast_fdividef`, `rcp64h`, ...) are computed exactly;
  directed rounding variants (`*_rz`, `*_ru`, `*_rd` arithmetic) raise NotImplementedError.
* fp8 conversions keep the interpreter's own (round-half-up) code; fp64->bf16 rounds via fp32.
* bf16 atomics, bf16 printing and `bool()` of a bf16 scalar still see raw bits; atomics are
  sequential (no races, no ordering effects); ints equal to 1 are not specialised to constexpr;
  there is no fma contraction of a*b+c; out-of-bounds accesses are not caught.

Set KERNELLOOP_INTERPRETER_FIDELITY=0 to leave the interpreter as Triton ships it.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable

import numpy as np

from kernelloop.kernels.interpreter_autotune import replacements as autotune_replacements
from kernelloop.kernels.interpreter_libdevice import extern_elementwise
from kernelloop.kernels.interpreter_speed import cached_builtins

log = logging.getLogger(__name__)

PATCHED = False  # True once patch_interpreter() has changed the interpreter
_WARNED = False
_UNDO: list[tuple[Any, str, Any]] = []  # (owner, name, original), to undo the patch in tests

# Members wrapped, with the parameters they must have (guards against a changed Triton).
_EXPECTED = {
    ("InterpreterBuilder", "cast_impl"): ["self", "src", "dst_type"],
    ("InterpreterBuilder", "binary_op"): ["self", "lhs", "rhs", "op"],
    ("InterpreterBuilder", "unary_op"): ["self", "arg", "op"],
    ("InterpreterBuilder", "create_fma"): ["self", "x", "y", "z"],
    ("InterpreterBuilder", "create_clampf"): ["self", "arg", "lo", "hi", "propagate_nans"],
    ("InterpreterBuilder", "create_dot"): ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"],
    ("InterpreterBuilder", "create_extern_elementwise"):
        ["self", "libName", "libPath", "symbol", "argList", "retType", "isPure"],
    ("ReduceOps", "sum"): ["self", "input"],
    ("ReduceOps", "min_max"): ["self", "input", "val_reduce_op", "idx_reduce_op"],
    ("ScanOps", "cumsum"): ["self", "input"],
    ("ScanOps", "cumprod"): ["self", "input"],
    (None, "_implicit_cvt"): ["arg"],
    (None, "_patch_lang"): ["fn"],
    (None, "_patch_builtin"): ["pkg", "builder", "scope"],
    (None, "_patch_attr"): ["obj", "name", "member", "builder", "scope"],
}


def patch_interpreter() -> None:
    """Patch Triton's interpreter for GPU fidelity; idempotent, a no-op unless interpreting."""
    global PATCHED
    if PATCHED or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    from kernelloop.kernels.interpreter_rewrite import install  # a safety layer, on even without fidelity
    install()
    if os.environ.get("KERNELLOOP_INTERPRETER_FIDELITY", "1") == "0":
        return
    try:
        import triton.language as tl
        import triton.language.extra.cuda.libdevice as cuda_lib
        import triton.language.extra.libdevice as generic_lib
        import triton.runtime.interpreter as interp

        for (owner, name), params in _EXPECTED.items():
            member = getattr(getattr(interp, owner) if owner else interp, name)
            if list(inspect.signature(member).parameters) != params:
                raise TypeError(f"{owner or 'interpreter'}.{name} has an unexpected signature")
        for name in ("TensorHandle", "interpreter_semantic", "_get_np_dtype", "_interpreter", "_ir"):
            getattr(interp, name)
        changes = _replacements(interp, tl, cuda_lib, generic_lib)  # built in full before any is applied
    except Exception as exc:  # an unknown Triton: leave it alone, say so once
        _warn(f"Triton interpreter internals are not as expected ({exc}); interpreter left unpatched, "
              "so bf16 arithmetic, libdevice and float arguments behave differently from a GPU")
        return
    for owner, name, value in changes:
        _UNDO.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    PATCHED = True


def _unpatch() -> None:
    """Undo patch_interpreter() (tests use it to show what the raw interpreter does)."""
    global PATCHED
    while _UNDO:
        owner, name, original = _UNDO.pop()
        setattr(owner, name, original)
    PATCHED = False


def _warn(message: str) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning(message)


# ---- bf16 bits <-> fp32 -------------------------------------------------------------------------

def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16(x: Any) -> np.ndarray:
    """Round fp32 to bf16 bits, nearest-even; NaN stays a (quiet) NaN."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32)  # same itemsize: fine for any shape or strides
    rounded = ((b + (((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), ((b >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def _f32_to_tf32(x: Any) -> np.ndarray:
    """fp32 rounded to TF32's 10 mantissa bits (nearest, ties away from zero), still stored as fp32;
    inf and NaN unchanged, a finite value past TF32's largest rounds to inf."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    rounded = ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def _is_bf16(handle: Any) -> bool:
    return handle.data.dtype.char == "H" and getattr(handle.dtype, "name", "") == "bf16"  # uint16 bits


def _low(handle: Any) -> tuple[Callable, Callable] | None:
    """(to fp32, back from fp32) for a bf16 or fp16 handle, else None."""
    if _is_bf16(handle):
        return _bf16_to_f32, _f32_to_bf16
    if handle.data.dtype.char == "e":  # float16
        return (lambda d: d.astype(np.float32)), (lambda d: np.asarray(d, np.float32).astype(np.float16))
    return None


# ---- the replacements: (owner, attribute, new value) -------------------------------------------

def _replacements(interp: Any, tl: Any, cuda_lib: Any, generic_lib: Any) -> list[tuple[Any, str, Any]]:
    return _bf16_builder(interp, tl) + _bf16_reductions(interp, tl) + _launch(interp, tl, cuda_lib, generic_lib) \
        + cached_builtins(interp, tl) + autotune_replacements()


def _bf16_builder(interp: Any, tl: Any) -> list[tuple[Any, str, Any]]:
    """InterpreterBuilder ops: bf16 operands computed in fp32 and rounded back, per op."""
    TH, B = interp.TensorHandle, interp.InterpreterBuilder
    orig_cast, orig_binary, orig_unary = B.cast_impl, B.binary_op, B.unary_op
    orig_fma, orig_clamp, orig_dot = B.create_fma, B.create_clampf, B.create_dot
    tf32 = interp._ir.INPUT_PRECISION.TF32

    def cast_impl(self, src, dst_type):
        dst = dst_type.scalar
        src_bf, dst_bf = _is_bf16(src), dst.name == "bf16"
        if not (src_bf or dst_bf):
            return orig_cast(self, src, dst_type)
        x = _bf16_to_f32(src.data) if src_bf else src.data
        if dst_bf:  # fp32/fp64/int -> fp32 -> bf16 (RNE)
            return TH(_f32_to_bf16(x.astype(np.float32)), dst)
        return TH(x.astype(interp._get_np_dtype(dst)), dst)

    def binary_op(self, lhs, rhs, op):
        if not (_is_bf16(lhs) and _is_bf16(rhs)):
            return orig_binary(self, lhs, rhs, op)
        out = np.asarray(op(_bf16_to_f32(lhs.data), _bf16_to_f32(rhs.data)))
        return TH(out, tl.int1) if out.dtype == np.bool_ else TH(_f32_to_bf16(out), lhs.dtype.scalar)

    def unary_op(self, arg, op):
        if not _is_bf16(arg):
            return orig_unary(self, arg, op)
        out = np.asarray(op(_bf16_to_f32(arg.data)))
        return TH(out, tl.int1) if out.dtype == np.bool_ else TH(_f32_to_bf16(out), arg.dtype.scalar)

    def create_fma(self, x, y, z):
        if not _is_bf16(z):
            return orig_fma(self, x, y, z)
        f = [_bf16_to_f32(h.data).astype(np.float64) for h in (x, y, z)]
        return TH(_f32_to_bf16((f[0] * f[1] + f[2]).astype(np.float32)), z.dtype.scalar)

    def create_clampf(self, arg, lo, hi, propagate_nans):
        if not _is_bf16(arg):
            return orig_clamp(self, arg, lo, hi, propagate_nans)
        a, low, high = (_bf16_to_f32(t.data) for t in (arg, lo, hi))
        if propagate_nans == interp._ir.PROPAGATE_NAN.NONE:
            out = np.fmin(np.fmax(a, low), high)
        else:
            out = np.clip(a, low, high)
        return TH(_f32_to_bf16(out), arg.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == tf32 and a.data.dtype == np.float32 and b.data.dtype == np.float32:
            # What tensor cores do with fp32 operands under TF32 (Triton's default precision):
            # round each operand to 10 mantissa bits first; the products accumulate in fp32.
            a, b = TH(_f32_to_tf32(a.data), a.dtype.scalar), TH(_f32_to_tf32(b.data), b.dtype.scalar)
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        if not (_is_bf16(a) or _is_bf16(b) or _is_bf16(d)):
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        af, bf, df = (_bf16_to_f32(h.data) if _is_bf16(h) else h.data.astype(np.float32) for h in (a, b, d))
        out = np.matmul(af, bf) + df  # fp32 products and accumulation, as the tensor cores do
        return TH(_f32_to_bf16(out) if _is_bf16(d) else out.astype(d.data.dtype), d.dtype.scalar)

    return [(B, "cast_impl", cast_impl), (B, "binary_op", binary_op), (B, "unary_op", unary_op),
            (B, "create_fma", create_fma), (B, "create_clampf", create_clampf), (B, "create_dot", create_dot)]


def _bf16_reductions(interp: Any, tl: Any) -> list[tuple[Any, str, Any]]:
    """tl.sum / cumsum / cumprod round like a GPU in bf16 and fp16; bf16 min/max/argmax by value."""
    R, S = interp.ReduceOps, interp.ScanOps
    orig_sum, orig_min_max, orig_cumsum, orig_cumprod = R.sum, R.min_max, S.cumsum, S.cumprod

    def red_sum(self, input):
        conv = _low(input.handle)
        if conv is None:
            return orig_sum(self, input)
        to32, back = conv
        x, axis = to32(input.handle.data), self.axis
        x = np.moveaxis(x.reshape(-1) if axis is None else x, 0 if axis is None else axis, -1)
        while x.shape[-1] > 1:  # pairwise tree, every partial sum rounded to the input dtype
            half = (x.shape[-1] + 1) // 2
            hi = x[..., half:]
            if hi.shape[-1] < half:
                hi = np.concatenate([hi, np.zeros_like(x[..., :1])], axis=-1)
            x = to32(back(x[..., :half] + hi))
        r = x[..., 0]
        if self.keep_dims:
            r = r.reshape([1] * input.handle.data.ndim) if axis is None else np.expand_dims(r, axis)
        return self.to_tensor(back(r), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        inp = input[0] if isinstance(input, tuple) else input
        if not _is_bf16(inp.handle):
            return orig_min_max(self, input, val_reduce_op, idx_reduce_op)
        x, kw = _bf16_to_f32(inp.handle.data), dict(axis=self.axis, keepdims=self.keep_dims)
        val = self.to_tensor(_f32_to_bf16(val_reduce_op(x, **kw)), inp.dtype) if val_reduce_op else None
        idx = self.to_tensor(idx_reduce_op(x, **kw), tl.int32) if idx_reduce_op else None
        return (val, idx) if val is not None and idx is not None else (val if val is not None else idx)

    def scan(op, original):
        def run(self, input):
            conv = _low(input.handle)
            if conv is None:
                return original(self, input)
            to32, back = conv
            x = np.moveaxis(to32(input.handle.data), self.axis, 0)
            out = np.empty_like(x)
            acc = out[0] = x[0]
            for i in range(1, x.shape[0]):  # sequential, each step rounded to the input dtype
                acc = out[i] = to32(back(op(acc, x[i])))
            return [self.to_tensor(back(np.moveaxis(out, 0, self.axis)), input.dtype)]
        return run

    return [(R, "sum", red_sum), (R, "min_max", min_max),
            (S, "cumsum", scan(np.add, orig_cumsum)), (S, "cumprod", scan(np.multiply, orig_cumprod))]


def _launch(interp: Any, tl: Any, cuda_lib: Any, generic_lib: Any) -> list[tuple[Any, str, Any]]:
    """Kernel arguments as the compiled launcher passes them; libdevice bound to the interpreter."""
    TH = interp.TensorHandle
    orig_cvt, orig_patch_lang = interp._implicit_cvt, interp._patch_lang

    def implicit_cvt(arg):
        if isinstance(arg, float):  # the compiled launcher passes Python floats as fp32
            with np.errstate(over="ignore"):
                data = np.array([arg], dtype=np.float32)
            return tl.tensor(TH(data, tl.float32), tl.float32)
        return orig_cvt(arg)

    def create_extern_elementwise(self, libName, libPath, symbol, argList, retType, isPure):
        ret = retType.scalar
        return TH(extern_elementwise(symbol, [h.data for h in argList], interp._get_np_dtype(ret), interp), ret)

    # The CUDA libdevice builtins, callable from interpreted code. The generic module's placeholders
    # map to them (as the compiler's module_map does); module attributes are replaced once, names a
    # kernel's module imported (`from ...libdevice import rsqrt`) are rebound for each launch.
    bound = {name: _bind(fn, interp) for name, fn in vars(cuda_lib).items() if tl.core.is_builtin(fn)}
    lib_modules = (cuda_lib.__name__, generic_lib.__name__)

    def patch_lang(fn):
        scope = orig_patch_lang(fn)
        undo = []
        g = fn.__globals__
        for key, value in list(g.items()):
            if getattr(value, "__module__", None) in lib_modules and getattr(value, "__name__", None) in bound:
                undo.append((key, value))
                g[key] = bound[value.__name__]
        return _Scope(scope, g, undo)

    return [(interp, "_implicit_cvt", implicit_cvt), (interp, "_patch_lang", patch_lang),
            (interp.InterpreterBuilder, "create_extern_elementwise", create_extern_elementwise)] + [
        (module, name, bound[name]) for module in (cuda_lib, generic_lib) for name in dir(module) if name in bound]


def _bind(fn: Callable, interp: Any) -> Callable:
    """A libdevice builtin callable from interpreted code (the interpreter supplies _semantic)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("_semantic", None)
        return fn(*args, _semantic=interp.interpreter_semantic, **kwargs)

    call.__name__ = fn.__name__
    call.__module__ = __name__  # not a libdevice module: patch_lang won't rebind it
    return call


class _Scope:
    """The interpreter's patch scope plus the kernel globals we rebound; restore() undoes both."""

    def __init__(self, inner: Any, globals_: dict, undo: list[tuple[str, Any]]) -> None:
        self.inner, self.globals, self.undo = inner, globals_, undo

    def set_attr(self, obj: object, name: str, value: object) -> None:
        self.inner.set_attr(obj, name, value)

    def restore(self) -> None:
        self.inner.restore()
        for key, value in reversed(self.undo):
            self.globals[key] = value
        self.undo = []
