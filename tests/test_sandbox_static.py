"""The static pre-check: forbidden code is refused with its line number; honest code passes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.ops import get_op
from sandbox.static_check import ALLOWED_IMPORTS, static_check

ARGS = ("x", "weight", "eps")
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
FORWARD = "\ndef forward(x, weight, eps):\n    return x\n"
CANDIDATES = Path(__file__).parent / "sandbox_candidates"
CONTROLS = sorted(CANDIDATES.glob("control_*.py"))


def check(body: str):
    return static_check(HEADER + body + FORWARD, ARGS)


@pytest.mark.parametrize("path", CONTROLS, ids=lambda p: p.stem)
def test_honest_candidates_pass(path: Path) -> None:
    from kernels.ops import get_op

    text = path.read_text()
    op = re.search(r"^# op:\s*(\w+)", text, re.M)
    assert static_check(text, get_op(op.group(1) if op else "rmsnorm").arg_names).ok


@pytest.mark.parametrize("path", sorted(CANDIDATES.glob("*.py")), ids=lambda p: p.stem)
def test_agrees_with_the_adversarial_expectations(path: Path) -> None:
    # Exploits the adversarial suite expects to be stopped later must get past the static check;
    # those it expects to stop here (`static=static`) must not.
    text = path.read_text()
    if re.search(r"^# expect:\s*registry-payload", text, re.M):
        pytest.skip("a registry payload, not a candidate (it never meets the static check)")
    expect = re.search(r"^# expect:\s*static=(\S+)", text, re.M)
    op = re.search(r"^# op:\s*(\w+)", text, re.M)
    result = static_check(text, get_op(op.group(1) if op else "rmsnorm").arg_names)
    if expect is None or "static" not in expect.group(1).split("|"):
        assert result.ok, result.reason
    elif expect.group(1) == "static":
        assert not result.ok


def test_logging_and_contextlib_are_allowed_imports() -> None:
    assert {"logging", "contextlib"} <= ALLOWED_IMPORTS


@pytest.mark.parametrize("body", [
    "class K:\n    def f(self):\n        return self._cache\n",
    "import logging\nlogger = logging.getLogger(__name__)\nlogger.info('n=%d', 3)\nlogger.debug('x')\n"
    "logger.warning('w')\n",
    "import contextlib\nfrom contextlib import contextmanager, nullcontext\nc = contextlib.nullcontext()\n",
    "from triton.language.extra import libdevice\nf = triton.language.extra.libdevice.rsqrt\n",
    "from triton.language.extra.cuda import libdevice\n",
    "n = triton.cdiv(10, 3) + triton.next_power_of_2(5)\nBLOCK: tl.constexpr = 128\nW = tl.constexpr(4)\n",
    "cap = torch.cuda.get_device_capability()\nhip = torch.version.hip is not None\n",
    "def info(t):\n    return (t.is_contiguous(), t.stride(), t.shape, t.dtype, t.device, t.data_ptr(), t.numel(),\n"
    "            t.element_size(), t.contiguous(), t.view(-1), t.reshape(-1), t.T, t.item(), f'{t.shape}')\n",
    "def kind(n):\n    match n:\n        case 1 | 2:\n            return 1\n"
    "        case [a, b]:\n            return a\n"
    "        case torch.float16:\n            return 2\n        case {'k': v}:\n            return v\n"
    "        case _:\n            return 0\n",
    "msg = '{} {name} {0!r:>4}'.format(1, name=2) + '{k}'.format_map({'k': 1})\n",
    "class Cache:\n    hits = 0\n    def get(self, key):\n        self.hits += 1\n        self._last = key\n"
    "        del self._last\n        return key\n    @classmethod\n    def reset(cls):\n        cls.hits = 0\n"
    "    @staticmethod\n    def grid(meta):\n        return (meta['n'],)\ng = Cache.grid({'n': 1})\n",
    "import enum\nclass Mode(enum.Enum):\n    A = 1\nm = Mode.A\nt = type(m) is Mode\n",
    "class Fn(torch.autograd.Function):\n    @staticmethod\n    def setup_context(ctx, inputs, output):\n"
    "        ctx.n = len(inputs)\n",
])
def test_allowed_forms_pass(body: str) -> None:
    result = check(body)
    assert result.ok, result.reason
    assert static_check(HEADER + "def forward(x, weight, eps, *, flag=False):\n    return x\n", ARGS).ok


LIGER = '''
import functools
import torch
import triton
import triton.language as tl

MAX_FUSED_SIZE = 65536


def calculate_settings(n):
    BLOCK_SIZE = triton.next_power_of_2(n)
    if BLOCK_SIZE > MAX_FUSED_SIZE:
        raise RuntimeError(f"Cannot launch Triton kernel since n = {n} exceeds {MAX_FUSED_SIZE}.")
    num_warps = 4
    if BLOCK_SIZE >= 32768:
        num_warps = 32
    elif BLOCK_SIZE >= 8192:
        num_warps = 16
    elif BLOCK_SIZE >= 2048:
        num_warps = 8
    return BLOCK_SIZE, num_warps


def ensure_contiguous(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args, **kwargs):
        def maybe_to_contiguous(x):
            return x.contiguous() if isinstance(x, torch.Tensor) else x
        args = [maybe_to_contiguous(arg) for arg in args]
        kwargs = {k: maybe_to_contiguous(v) for k, v in kwargs.items()}
        return fn(ctx, *args, **kwargs)
    return wrapper


@triton.jit
def _rms_norm_forward_kernel(Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, RSTD_ptr, n_cols, eps,
                             BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(X_row * X_row, axis=0) / n_cols + eps)
    tl.store(RSTD_ptr + row_idx, rstd)
    tl.store(Y_ptr + row_idx * Y_row_stride + col_offsets, (X_row * rstd * W_row).to(Y_ptr.dtype.element_ty),
             mask=mask)


def rms_norm_forward(X, W, eps):
    shape = X.shape
    dim = shape[-1]
    X = X.view(-1, dim)
    n_rows, n_cols = X.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
    RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
    _rms_norm_forward_kernel[(n_rows,)](Y, Y.stride(0), X, X.stride(0), W, RSTD, n_cols, eps,
                                        BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return Y.view(*shape), X, RSTD, BLOCK_SIZE, num_warps


class LigerRMSNormFunction(torch.autograd.Function):
    @staticmethod
    @ensure_contiguous
    def forward(ctx, X, W, eps):
        Y, X, RSTD, BLOCK_SIZE, num_warps = rms_norm_forward(X, W, eps)
        ctx.eps = eps
        ctx.BLOCK_SIZE = BLOCK_SIZE
        ctx.num_warps = num_warps
        ctx.save_for_backward(X, W, RSTD)
        return Y

    @staticmethod
    @ensure_contiguous
    def backward(ctx, dY):
        X, W, RSTD = ctx.saved_tensors
        raise NotImplementedError("inference only")


def forward(x, weight, eps):
    return LigerRMSNormFunction.apply(x, weight, eps)
'''

SGLANG = '''
from __future__ import annotations

import logging
from typing import Optional

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)
_is_hip = torch.version.hip is not None
_is_sm90 = (not _is_hip) and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, d, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    for start in range(0, d, BLOCK_SIZE):
        cols = start + offs
        mask = cols < d
        gate = tl.load(gate_up_ptr + pid * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + pid * stride_in + d + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + pid * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    d = x.shape[-1] // 2
    if out is None:
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
    if not x.is_contiguous():
        logger.warning("silu_and_mul: non-contiguous input of stride %s", x.stride())
        x = x.contiguous()
    rows = x.numel() // x.shape[-1]
    with torch.cuda.device(x.device):
        _silu_and_mul_kernel[(rows,)](x, out, x.stride(-2), out.stride(-2), d,
                                      BLOCK_SIZE=1024 if _is_sm90 else 512)
    return out


def forward(x):
    logger.debug("silu_and_mul %s %s", tuple(x.shape), x.dtype)
    return silu_and_mul(x)
'''

FLAGGEMS = '''
import logging
import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

logger = logging.getLogger(__name__)


@triton.autotune(
    configs=[triton.Config({"BLOCK_N": b}, num_warps=w, num_stages=s)
             for b in (512, 1024, 2048) for w in (4, 8) for s in (1, 2)],
    key=["N"],
)
@triton.jit
def rms_norm_kernel(Y, X, W, y_stride_r, x_stride_r, N, eps, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    Y += pid * y_stride_r
    X += pid * x_stride_r
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rrms = libdevice.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, (x * rrms * w).to(Y.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    logger.debug("GEMS RMS_NORM FORWARD")
    N = math.prod(x.shape[-1:])
    M = x.numel() // N
    x = x.contiguous()
    weight = weight.contiguous()
    y = torch.empty_like(x)
    with torch.cuda.device(x.device):
        rms_norm_kernel[(M,)](y, x, weight, N, N, N, eps)
    return y
'''

UNSLOTH = '''
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

MAX_FUSED_SIZE: int = 65536
next_power_of_2 = triton.next_power_of_2
triton_tanh = libdevice.tanh


def calculate_settings(n: int) -> (int, int,):
    BLOCK_SIZE: int = next_power_of_2(n)
    if BLOCK_SIZE > MAX_FUSED_SIZE:
        raise RuntimeError(f"Cannot launch Triton kernel since n = {n} exceeds the maximum CUDA blocksize.")
    num_warps: int = 4
    if BLOCK_SIZE >= 32768:
        num_warps = 32
    elif BLOCK_SIZE >= 8192:
        num_warps = 16
    elif BLOCK_SIZE >= 2048:
        num_warps = 8
    return BLOCK_SIZE, num_warps


@triton.jit
def _rms_layernorm_forward(Y, Y_row_stride, X, X_row_stride, W, r, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    X_row = tl.load(X + row_idx * X_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask=mask, other=0).to(tl.float32)
    inv_var = tl.math.rsqrt(tl.sum(X_row * X_row, axis=0) / n_cols + eps)
    tl.store(r + row_idx, inv_var)
    tl.store(Y + row_idx * Y_row_stride + col_offsets, (X_row * inv_var * W_row).to(W_row.dtype), mask=mask)


class Fast_RMS_Layernorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool = False):
        shape = X.shape
        dim: int = shape[-1]
        X = X.view(-1, dim)
        n_rows, n_cols = X.shape
        BLOCK_SIZE, num_warps = calculate_settings(n_cols)
        Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
        r = torch.empty(n_rows, dtype=torch.float32, device=X.device)
        with torch.cuda.device(X.device):
            _rms_layernorm_forward[(n_rows,)](Y, Y.stride(0), X, X.stride(0), W, r, n_cols, eps,
                                              BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
        ctx.eps = eps
        ctx.BLOCK_SIZE = BLOCK_SIZE
        ctx.num_warps = num_warps
        ctx.GEMMA = gemma
        ctx.save_for_backward(X, W, r)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY: torch.Tensor):
        X, W, r = ctx.saved_tensors
        return None, None, None, None


def forward(x, weight, eps):
    return Fast_RMS_Layernorm.apply(x, weight, eps, False)
'''

CONTEXTLIB = '''
import contextlib
import logging
from contextlib import contextmanager, nullcontext

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)


@contextmanager
def device_guard(t):
    if t.is_cuda:
        with torch.cuda.device(t.device):
            yield
    else:
        with nullcontext():
            yield


@contextlib.contextmanager
def quiet():
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _scale_kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, EVEN_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x + eps).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    y = torch.empty_like(x)
    n = x.numel()
    with quiet(), device_guard(x):
        _scale_kernel[(triton.cdiv(n, 1024),)](x, weight, y, n, eps, BLOCK=1024)
    return y
'''

DATACLASS_CONFIG = '''
from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache, partial, reduce
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class LaunchConfig:
    block: int
    num_warps: int
    grid: Tuple[int, ...] = ()


@dataclass
class ConfigCache:
    entries: Dict[Tuple[int, str], LaunchConfig] = field(default_factory=dict)
    hits: int = 0

    def get(self, n: int, dtype: torch.dtype) -> Optional[LaunchConfig]:
        found = self.entries.get((n, str(dtype)))
        if found is not None:
            self.hits += 1
        return found

    def put(self, n: int, dtype: torch.dtype, cfg: LaunchConfig) -> None:
        self.entries[(n, str(dtype))] = cfg


_CACHE = ConfigCache()


@lru_cache(maxsize=None)
def pick(n: int) -> LaunchConfig:
    block = min(triton.next_power_of_2(n), 4096)
    warps = max(1, min(16, block // 256))
    return LaunchConfig(block=block, num_warps=warps, grid=(triton.cdiv(n, block),))


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    cfg = _CACHE.get(n, x.dtype) or pick(n)
    _CACHE.put(n, x.dtype, dataclasses.replace(cfg))
    rows = reduce(operator.mul, x.shape[:-1], 1)
    assert math.isfinite(eps) and all(s >= 0 for s in itertools.chain(x.shape, x.stride()))
    x2 = x.reshape(rows, n) if x.is_contiguous() else x.contiguous().reshape(rows, n)
    y = torch.empty_like(x2)
    launch = partial(_row_kernel[(rows,)], num_warps=cfg.num_warps)
    if rows and n:
        launch(x2, weight, y, x2.stride(0), n, eps, BLOCK=cfg.block)
    return y.view(x.shape)
'''


@pytest.mark.parametrize("source", [LIGER, SGLANG, FLAGGEMS, UNSLOTH, CONTEXTLIB, DATACLASS_CONFIG],
                         ids=["liger", "sglang", "flaggems", "unsloth", "contextlib", "dataclass-config"])
def test_real_code_passes(source: str) -> None:
    args = ("x",) if source is SGLANG else ARGS
    result = static_check(source, args)
    assert result.ok, result.reason


@pytest.mark.parametrize("body, line, words", [
    ("import os", 4, "import of 'os'"),
    ("from subprocess import run", 4, "import of 'subprocess'"),
    ("import numpy as np", 4, "import of 'numpy'"),
    ("import importlib", 4, "import of 'importlib'"),
    ("from . import x", 4, "relative imports"),
    ("m = __import__('os')", 4, "'__import__'"),
    ("c = torch.ones(1).__class__", 4, "dunder attribute"),
    ("c = torch._C", 4, "private attribute"),
    ("f = open('/tmp/x', 'w')", 4, "'open'"),
    ("y = eval('1')", 4, "'eval'"),
    ("g = getattr(torch, 'allclose')", 4, "'getattr'"),
    ("torch.allclose = lambda *a, **k: True", 4, "monkeypatching"),
    ("tl.sum += 1", 4, "monkeypatching"),
    ("t = torch\nt.allclose = None", 5, "only a method's own self/cls/ctx"),
    ("def f(m):\n    m.allclose = None", 5, "only a method's own self/cls/ctx"),
    ("torch.utils.cpp_extension.load_inline('x', '')", 4, ".cpp_extension"),
    ("s = torch.cuda.Stream()", 4, ".Stream"),
    ("v = torch.ones(2).tolist()", 4, ".tolist"),
    ("raise SystemExit(0)", 4, "'SystemExit'"),
    ("b = __builtins__", 4, "'__builtins__'"),
])
def test_forbidden_code_is_refused_with_its_line(body: str, line: int, words: str) -> None:
    result = check(body)
    assert not result.ok
    assert result.reason.startswith(f"line {line}:") and words in result.reason, result.reason


# Concrete escapes, grouped by gap. The earlier check let most of them through; the getattr, vars and
# dunder spellings and some attribute writes it already refused stay here as regressions.
GAPS = [
    # 1. names imported with `from X import name` / `import X.y as z` are checked like attributes
    ("from-torch-ops", "from torch import ops\nops.aten.add", 4, "import of 'torch.ops': attribute .ops"),
    ("from-utils-cpp-extension", "from torch.utils import cpp_extension", 4, ".cpp_extension"),
    ("from-runtime-driver", "from triton.runtime import driver\nd = driver.active", 4, ".driver"),
    ("from-torch-library-as", "from torch import library as L", 4, "import of 'torch.library'"),
    ("import-as-cpp-extension", "import torch.utils.cpp_extension as ce", 4, ".cpp_extension"),
    ("from-operator-attrgetter", "from operator import attrgetter", 4, ".attrgetter"),
    ("from-torch-load", "from torch import load", 4, "'torch.load'"),
    # 2. private components anywhere in a dotted import path
    ("import-private-module", "import torch._dynamo", 4, "private attribute access ._dynamo"),
    ("from-private-module", "from torch._C import _get_tracing_state", 4, "._C"),
    ("import-private-leaf", "import triton.runtime._foo", 4, "._foo"),
    ("from-private-dispatch", "from torch.utils._python_dispatch import TorchDispatchMode", 4, "._python_dispatch"),
    ("from-private-name", "from torch import _C", 4, "._C"),
    # 3. string-driven attribute helpers, frames and code objects
    ("attrgetter", "import operator\nf = operator.attrgetter('allclose')(torch)", 5, ".attrgetter"),
    ("methodcaller", "import operator\nf = operator.methodcaller('cpu')", 5, ".methodcaller"),
    ("reduce-getattr", "import functools\nf = functools.reduce(getattr, ['x'], torch)", 5, "'getattr'"),
    ("partial-getattr", "import functools\nf = functools.partial(getattr, torch)", 5, "'getattr'"),
    ("format-dunder-field", "s = '{0.__class__}'.format(1)", 4, "{0.__class__}"),
    ("format-attribute-field", "s = '{0.shape}'.format(torch.ones(1))", 4, ".format is allowed only"),
    ("format-map-index-field", "s = '{d[k]}'.format_map({'d': {'k': 1}})", 4, ".format_map is allowed only"),
    ("format-on-a-variable", "t = '{0.__class__}'\ns = t.format(1)", 4, "reaches a private or dunder"),
    ("format-built-template", "t = '{0.' + '_' * 2 + 'class__}'\ns = t.format(1)", 5, ".format is allowed only"),
    ("logging-formatter-field", "import logging\nf = logging.Formatter('{msg.__class__}', style='{')", 5,
     "reaches a private or dunder"),
    ("vars", "v = vars(torch)", 4, "'vars'"),
    ("dir", "v = dir(torch)", 4, "'dir'"),
    ("type-three-args", "K = type('K', (), {})", 4, "type(x)"),
    ("type-alias", "t = type\nK = t('K', (), {})", 4, "type(x)"),
    ("type-attribute", "class K:\n    def f(self):\n        self.allclose = None\nk = K()\ntype(k).f(torch)", 8,
     "type(...)"),
    ("object-getattribute", "f = object.__getattribute__(torch, 'ops')", 4, "dunder"),
    ("generator-frame", "def g():\n    yield\nf = g().gi_frame", 6, ".gi_frame"),
    ("frame-back-globals", "def h(frame):\n    return frame.f_back.f_globals", 5, ".f_back"),
    ("traceback-frame", "try:\n    1 / 0\nexcept Exception as e:\n    t = e.args\nf = t.tb_frame", 8, ".tb_frame"),
    ("func-code", "def g():\n    pass\nc = g.func_code", 6, ".func_code"),
    ("code-consts", "def h(code):\n    return code.co_consts", 5, ".co_consts"),
    ("mro", "m = torch.Tensor.mro()", 4, ".mro"),
    ("logging-currentframe", "import logging\nf = logging.currentframe().f_globals", 5, ".currentframe"),
    ("logging-config", "import logging.config", 4, ".config"),
    ("get-type-hints", "import typing\nh = typing.get_type_hints(forward)", 5, ".get_type_hints"),
    ("torch-load", "m = torch.load(object(), weights_only=False)", 4, "torch.load is not allowed"),
    ("triton-build", "m = triton.runtime.build.compile_module_from_src('', 'm')", 4, ".build"),
    # 4. class patterns read attributes
    ("match-class", "def f(x):\n    match x:\n        case torch.Tensor():\n            return 1", 6, "class patterns"),
    ("match-class-kwargs", "def f(x):\n    match x:\n        case tl.tensor(dtype=d):\n            return d", 6,
     "class patterns"),
    # 5. attribute writes only on a method's own first parameter
    ("top-level-self", "def f(self):\n    self.allclose = None\nf(torch)", 5, "only a method's own"),
    ("top-level-ctx", "def f(ctx):\n    ctx.allclose = None", 5, "only a method's own"),
    ("staticmethod-param", "class K:\n    @staticmethod\n    def f(m):\n        m.allclose = None", 7,
     "only a method's own"),
    ("second-param", "class K:\n    def f(self, m):\n        m.allclose = None", 6, "only a method's own"),
    ("nested-def-in-method", "class K:\n    def f(self):\n        def g():\n            self.x = 1", 7,
     "only a method's own"),
    ("rebind-self", "class K:\n    def f(self):\n        self = torch\n        self.allclose = None", 6,
     "rebinding 'self'"),
    ("rebind-self-walrus", "class K:\n    def f(self):\n        if (self := torch):\n            self.allclose = 1",
     6, "rebinding 'self'"),
    ("rebind-self-import", "class K:\n    def f(self):\n        import torch as self\n        self.allclose = 1", 6,
     "rebinding 'self'"),
    ("method-through-class", "class K:\n    def f(self):\n        self.allclose = None\nK.f(torch)", 7,
     "through a class"),
    ("autograd-forward-direct", "class Fn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        ctx.allclose = None\nFn.forward(torch, 1)", 8, "through a class"),
    ("subclass-method-through-class", "class K:\n    def f(self):\n        self.allclose = None\nclass B(K):\n"
     "    pass\nB.f(torch)", 9, "through a class"),
    ("classmethod-hijack", "class K:\n    def f(self):\n        self.allclose = None\n    @classmethod\n"
     "    def g(cls):\n        cls.f(torch)", 9, "through a class"),
    ("update-wrapper", "import functools\nclass P:\n    def __init__(self):\n        self.allclose = None\n"
     "functools.update_wrapper(torch, P())", 8, ".update_wrapper"),
    ("wraps-called", "import functools\nclass P:\n    def __init__(self):\n        self.allclose = None\n"
     "functools.wraps(P())(torch)", 8, "only as a decorator"),
    ("wraps-imported", "from functools import wraps\nw = wraps(forward)", 5, "only as a decorator"),
    ("private-read-top-level-self", "def f(self):\n    return self._C\nc = f(torch)", 5, "private attribute"),
    ("for-target", "for torch.allclose in [None]:\n    pass", 4, "monkeypatching"),
    ("with-target", "import contextlib\nwith contextlib.nullcontext() as torch.allclose:\n    pass", 5,
     "monkeypatching"),
    ("comprehension-target", "y = [0 for torch.allclose in [None]]", 4, "monkeypatching"),
    ("del-attribute", "del torch.allclose", 4, "monkeypatching"),
    ("annotated-attribute", "torch.allclose: object = None", 4, "monkeypatching"),
    ("class-body-write", "class K:\n    torch.allclose = None", 5, "monkeypatching"),
]


@pytest.mark.parametrize("body, line, words", [g[1:] for g in GAPS], ids=[g[0] for g in GAPS])
def test_each_gap_is_refused(body: str, line: int, words: str) -> None:
    result = check(body)
    assert not result.ok
    assert result.reason.startswith(f"line {line}:") and words in result.reason, result.reason


def test_syntax_error_reports_its_line() -> None:
    result = static_check(HEADER + "def forward(x, weight, eps):\n    return (x\n", ARGS)
    assert not result.ok and "syntax error" in result.reason and result.line >= 5


@pytest.mark.parametrize("source, words", [
    (HEADER + "def kernel(x, weight, eps):\n    return x\n", "no top-level `def forward"),
    (HEADER + "def forward(x, weight):\n    return x\n", "takes 2 positional arguments"),
    (HEADER + "async def forward(x, weight, eps):\n    return x\n", "must not be async"),
    (HEADER + "def forward(x, weight, eps, *, mode):\n    return x\n", "required keyword-only"),
])
def test_forward_and_its_signature(source: str, words: str) -> None:
    result = static_check(source, ARGS)
    assert not result.ok and words in result.reason, result.reason


def test_first_problem_by_line_is_reported() -> None:
    result = static_check(HEADER + "x = 1\nimport socket\nimport os" + FORWARD, ARGS)
    assert result.reason.startswith("line 5:") and "socket" in result.reason


@pytest.mark.parametrize("body, words", [
    ("def f():\n    return inspect.getmembers(torch)\n", "'inspect' is never defined"),
    ("def f():\n    return np.zeros(3)\n", "'np' is never defined"),
    ("from functools import singledispatch\n", "singledispatch"),
])
def test_names_from_nowhere_and_annotation_evaluators_are_refused(body: str, words: str) -> None:
    result = check(body)
    assert not result.ok and words in result.reason, result.reason


def test_names_bound_anywhere_are_fine() -> None:
    body = ("def f(a, *rest, **kw):\n    try:\n        pass\n    except ValueError as err:\n        raise err\n"
            "    for i in range(3):\n        j = [k for k in rest]\n    return (y := a) + i + len(j) + y\n")
    assert check(body).ok, check(body).reason
