"""Purity, statically: no state written after import, no clock, no randomness the op
does not pass in, nothing of the process's environment. Planted variants of each way to keep state are
refused with their line and the reason; the idioms real kernels use (module tables built at import,
cached pure launch helpers, fresh locals, __init__ writes, autograd ctx, device queries at import,
iterators consumed at import) pass.
"""

from __future__ import annotations

import pytest

from tests.sandbox_support import check

KERNEL = ("@triton.jit\ndef _k(x_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n"
          "    acc = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\n    acc += acc\n    s = acc.sort()\n"
          "    tl.store(x_ptr + offs, s, mask=offs < n)\n")

STATE = [
    # module-level names rebound or containers changed from a function
    ("global-counter", "_n = 0\ndef f():\n    global _n\n    _n += 1\n", 6, "`global _n` writes state"),
    ("global-for-target", "_last = 0\ndef f(xs):\n    global _last\n    for _last in xs:\n        pass\n", 6, "global _last"),
    ("nonlocal-counter", "def make():\n    n = 0\n    def tick():\n        nonlocal n\n        n += 1\n        return n\n"
     "    return tick\n", 7, "`nonlocal n`"),
    ("dict-store", "_S = {}\ndef f(x):\n    _S['n'] = x\n", 6, "changes module-level state `_S` after import"),
    ("dict-augassign", "_S = {'n': 0}\ndef f():\n    _S['n'] += 1\n", 6, "module-level state `_S`"),
    ("dict-del", "_S = {'n': 0}\ndef f():\n    del _S['n']\n", 6, "module-level state `_S`"),
    ("nested-store", "_S = {'a': [0]}\ndef f():\n    _S['a'][0] = 1\n", 6, "module-level state `_S['a']`"),
    ("tensor-slot", "_S = [None]\ndef f(x):\n    _S[0] = x\n", 6, "module-level state `_S`"),
    ("bound-method-kept", "_L = []\npush = _L.append\n", 5, "a bound .append kept from import time"),
    ("map-append", "_L = []\ndef f(xs):\n    return list(map(_L.append, xs))\n", 6, "calls .append on module-level state"),
    ("dict-update-unbound", "_S = {}\ndef f():\n    dict.update(_S, {'n': 1})\n", 6, "calls .update on `dict`"),
    ("setattr-free-update", "_S = {}\ndef f():\n    _S.update(n=1)\n", 6, "calls .update on module-level state `_S`"),
    ("setdefault", "_S = {}\ndef f(k):\n    return _S.setdefault(k, 0)\n", 6, "calls .setdefault"),
    ("list-sort", "_L = [3, 1]\ndef f():\n    _L.sort()\n", 6, "calls .sort"),
    ("set-add", "_SEEN = set()\ndef f(k):\n    _SEEN.add(k)\n", 6, "calls .add"),
    ("set-discard", "_SEEN = {1}\ndef f(k):\n    _SEEN.discard(k)\n", 6, "calls .discard"),
    ("list-pop", "_L = [1]\ndef f():\n    return _L.pop()\n", 6, "calls .pop"),
    ("operator-setitem", "import operator\n_S = {}\ndef f():\n    operator.setitem(_S, 'n', 1)\n", 7,
     "operator.setitem changes its argument in place"),
    ("operator-iadd", "from operator import iadd\n", 4, "operator.iadd changes its argument in place"),
    ("parameter-append", "def f(box):\n    box.append(1)\n", 5, "`box`, which may hold state shared between calls"),
    ("default-container", "def f(x, _seen=[]):\n    _seen.append(x)\n", 5, "`_seen`, which may hold state"),
    ("alias-of-module-list", "_L = []\ndef f():\n    l = _L\n    l.append(1)\n", 7, "`l`, which may hold state"),
    ("through-fresh-container", "_L = []\ndef f():\n    d = {'a': _L}\n    d['a'].append(1)\n", 7, "`d['a']`"),
    ("through-a-literal", "_L = []\ndef f():\n    [_L][0].append(1)\n", 6, "`[_L][0]`, the result of an expression"),
    ("through-a-dict-literal", "_L = []\ndef f():\n    {'a': _L}['a'][0] = 1\n", 6, "the result of an expression"),
    ("loop-target", "_L = [[0]]\ndef f():\n    for row in _L:\n        row[0] = 1\n", 7, "`row`, which may hold state"),
    ("call-result", "_S = {}\ndef get():\n    return _S\ndef f():\n    get()['k'] = 1\n", 8, "`get()`"),
    ("closure-container", "def make():\n    seen = []\n    def f(x):\n        seen.append(x)\n    return f\n", 7,
     "`seen`, which outlives the call"),
    ("generator-send", "def f(gen):\n    gen.send(None)\n", 5, "calls .send on `gen`"),
    ("generator-in-a-container", "def g():\n    yield\n_G = [g()]\n", 6, "the generator g()"),
    ("tensor-kept-in-place", "def _zeros():\n    return torch.zeros(1)\n_C = _zeros()\ndef f():\n    _C.add_(1)\n", 8,
     "changes in place (.add_) module-level state `_C`"),
    ("tensor-kept-out", "_C = [None]\ndef f(a, b):\n    torch.add(a, b, out=_C[0])\n", 6, "writes into module-level state"),
    ("tensor-kept-function", "_C = [None]\ndef f():\n    torch.Tensor.zero_(_C[0])\n", 6,
     "torch.Tensor.zero_ changes module-level state"),
    ("input-in-place", "def f(x, y):\n    x.copy_(y)\n", 5, "changes in place (.copy_) `x`"),
    # instances and classes change only while they are built
    ("self-outside-init", "class K:\n    def f(self):\n        self.n = 1\n", 6, "writes `self.n` outside __init__"),
    ("self-augassign", "class K:\n    def __init__(self):\n        self.n = 0\n    def f(self):\n        self.n += 1\n", 8,
     "changes `self.n` in place"),
    ("self-container", "class K:\n    def __init__(self):\n        self.d = {}\n    def f(self, k):\n        self.d[k] = 1\n", 8,
     "changes `self.d` (instances must not change"),
    ("self-append-in-init", "class K:\n    items = []\n    def __init__(self):\n        self.items.append(1)\n", 7,
     "calls .append on `self.items`"),
    ("self-del-in-init", "class K:\n    def __init__(self):\n        self.a = 1\n        del self.a\n", 7, "changes `self.a` in place"),
    ("cls-write", "class K:\n    n = 0\n    @classmethod\n    def f(cls):\n        cls.n = 1\n", 8, "writes class state `cls.n`"),
    ("class-attribute-through-class", "class K:\n    seen = {}\ndef f(k):\n    K.seen[k] = 1\n", 7,
     "module-level state `K.seen`"),
    ("instance-attribute-write", "class K:\n    pass\n_I = K()\ndef f():\n    _I.n = 1\n", 8, "only a method's own"),
    ("ctx-container", "class Fn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        ctx.saved = []\n        ctx.saved.append(x)\n        return x\n", 8, "calls .append on `ctx.saved`"),
    # iterators, tensors and caches made at import
    ("iter-kept", "_IT = iter(range(10))\n", 4, "iter(...) made at import and kept"),
    ("zip-kept", "_Z = zip((1, 2), (3, 4))\n", 4, "zip(...) made at import"),
    ("genexp-kept", "_G = (i for i in range(3))\n", 4, "a generator expression made at import"),
    ("itertools-count", "import itertools\n_C = itertools.count()\n", 5, "itertools.count(...) made at import"),
    ("itertools-cycle-in-dict", "import itertools\n_C = {'k': itertools.cycle([1, 2])}\n", 5, "itertools.cycle"),
    ("generator-kept", "def gen():\n    yield 1\n_G = gen()\n", 6, "the generator gen()"),
    ("next-on-parameter", "def f(it):\n    return next(it)\n", 5, "next() advances `it`"),
    ("next-on-module-name", "_IT = [1]\ndef f():\n    return next(_IT)\n", 6, "next() advances `_IT`"),
    ("tensor-at-import", "_BUF = torch.empty(16)\n", 4, "torch.empty(...) runs at import"),
    ("tensor-in-default", "def f(x, buf=torch.zeros(4)):\n    return buf\n", 4, "torch.zeros(...) runs at import"),
    ("tensor-in-class-body", "class K:\n    buf = torch.ones(2)\n", 5, "torch.ones(...) runs at import"),
    ("cache-around-a-lambda", "import functools\nc = functools.lru_cache(maxsize=None)(lambda n: n)\n", 5,
     "functools.lru_cache/cache is allowed only as a decorator"),
    ("cache-around-torch", "import functools\nz = functools.cache(torch.zeros)\n", 5, "allowed only as a decorator"),
    ("cache-passed-on", "from functools import lru_cache\nwrap = lru_cache\n", 5, "allowed only as a decorator"),
    ("cached-allocation", "import functools\n@functools.lru_cache(maxsize=None)\ndef buf(n):\n    return torch.empty(n)\n",
     7, "buf is cached and allocates a tensor"),
    ("cached-allocation-like", "from functools import cache\n@cache\ndef buf(x):\n    return x.new_empty(4)\n", 7,
     "is cached and allocates a tensor"),
]

CLOCKS_RANDOMNESS_ENVIRONMENT = [
    ("torch.rand(1)", "uses a random generator"), ("torch.randn(2, 3)", "random generator"),
    ("torch.randint(0, 4, (2,))", "random generator"), ("torch.randn_like(x)", "random generator"),
    ("torch.randperm(4)", "random generator"), ("torch.bernoulli(x)", "random generator"),
    ("torch.multinomial(x, 1)", "random generator"), ("x.normal_()", "random generator"),
    ("x.uniform_()", "random generator"), ("x.exponential_()", "random generator"),
    ("torch.manual_seed(0)", "random generator"), ("torch.Generator()", "random generator"),
    ("torch.initial_seed()", "random generator"), ("torch.seed()", "random generator"),
    ("torch.get_rng_state()", "random generator"), ("torch.random.fork_rng()", "random generator"),
    ("torch.cuda.manual_seed(0)", "random generator"), ("torch.nn.functional.dropout(x, 0.1)", "random generator"),
    ("triton.testing.do_bench(lambda: 0)", "reads a clock"), ("torch.utils.benchmark.Timer()", "reads a clock"),
    ("torch.profiler.profile()", "reads a clock"), ("torch.autograd.profiler.record_function('x')", "reads a clock"),
    ("torch.get_num_threads()", "reads the process's environment"),
    ("torch.get_num_interop_threads()", "environment"), ("torch.is_grad_enabled()", "environment"),
    ("torch.is_inference_mode_enabled()", "environment"), ("x.is_inference()", "environment"),
    ("x.requires_grad", "environment"), ("x.grad_fn", "environment"), ("x.is_leaf", "environment"),
    ("x.is_shared()", "environment"), ("x.is_pinned()", "environment"),
    ("torch.is_autocast_enabled()", "environment"), ("torch.get_default_dtype()", "environment"),
    ("torch.are_deterministic_algorithms_enabled()", "environment"), ("torch.compiler.is_compiling()", "environment"),
    ("torch.jit.is_scripting()", "environment"), ("torch.cuda.memory_allocated()", "environment"),
    ("torch.cuda.max_memory_reserved()", "environment"), ("torch.cuda.mem_get_info()", "environment"),
    ("torch.cuda.memory_stats()", "environment"), ("torch.cuda.utilization()", "environment"),
    ("torch.cuda.temperature()", "environment"), ("torch.cuda.is_current_stream_capturing()", "environment"),
    ("torch.cuda.current_stream()", "environment"), ("torch.cuda.is_initialized()", "environment"),
    ("torch.cuda.memory.memory_snapshot()", "memory state"),
    ("torch.backends.cuda.matmul.allow_tf32", "process-wide torch setting"),
    ("torch.backends.cudnn.benchmark", "process-wide torch setting"), ("torch.backends.cudnn.enabled", "setting"),
    ("torch.set_num_threads(1)", "changes process-wide state"), ("torch.set_default_dtype(torch.float16)", "process-wide"),
    ("torch.set_flush_denormal(True)", "process-wide"), ("torch.set_float32_matmul_precision('high')", "process-wide"),
    ("torch.use_deterministic_algorithms(True)", "environment"), ("triton.set_allocator(None)", "process-wide"),
    ("torch.cuda.empty_cache()", "environment"),
    ("_k.cache", "runtime state"), ("_k.best_config", "runtime state"), ("_k.timings", "runtime state"),
    ("_k.device_caches", "runtime state"), ("_k.nargs", "runtime state"), ("_k.restore_copies", "runtime state"), ("g.cache_info()", "runtime state"), ("g.cache_clear()", "runtime state"),
    ("hash('x')", "different value in every process"), ("id(x)", "different value in every process"),
    ("list(map(id, [x]))", "different value in every process"),
]

IMPORTS_OF_THE_SAME = [
    ("from torch import rand", "random generator"), ("from triton.testing import do_bench", "reads a clock"),
    ("import triton.testing", "reads a clock"), ("import torch.utils.benchmark as b", "reads a clock"),
    ("from torch.cuda import memory_allocated", "environment"), ("from torch import get_num_threads", "environment"),
    ("from torch.random import manual_seed", "random generator"),
]


@pytest.mark.parametrize("body, line, words", [c[1:] for c in STATE], ids=[c[0] for c in STATE])
def test_state_written_after_import_is_refused(body: str, line: int, words: str) -> None:
    result = check(body)
    assert not result.ok
    assert result.reason.startswith(f"line {line}:") and words in result.reason, result.reason


@pytest.mark.parametrize("expr, words", CLOCKS_RANDOMNESS_ENVIRONMENT, ids=[c[0] for c in CLOCKS_RANDOMNESS_ENVIRONMENT])
def test_clocks_randomness_and_environment_are_refused(expr: str, words: str) -> None:
    body = (KERNEL + "import functools\n@functools.lru_cache(maxsize=None)\ndef g(n):\n    return n\n"
            f"def f(x):\n    return {expr}\n")
    result = check(body)
    assert not result.ok
    assert result.reason.startswith("line 16:") and words in result.reason, result.reason


@pytest.mark.parametrize("line, words", IMPORTS_OF_THE_SAME, ids=[c[0] for c in IMPORTS_OF_THE_SAME])
def test_imports_of_them_are_refused(line: str, words: str) -> None:
    result = check(line + "\n")
    assert not result.ok and result.reason.startswith("line 4:") and words in result.reason, result.reason


def test_the_reason_names_the_state_and_says_why() -> None:
    result = check("_CALLS = {'n': 0}\n\n\ndef count():\n    _CALLS['n'] += 1\n")
    assert result.reason == ("line 8: changes module-level state `_CALLS` after import (kernels must be pure: "
                             "a check's few calls must predict a server's many)")


HONEST = [
    ("module-constants", "MAX_FUSED_SIZE = 65536\nBLOCKS = (128, 256)\nTABLE = {'a': 1, 'b': (2, 3)}\n"
     "NAMES = [n.upper() for n in ('a', 'b')]\n"),
    ("tables-built-at-import", "_T = {}\nfor k in range(4):\n    _T[k] = k * 2\n_L = []\n_L.append(1)\n_L.extend([2, 3])\n"
     "_L.sort()\nclass K:\n    table = {}\n    table['x'] = 1\n"),
    ("cached-pure-launch-helpers", "import functools\nfrom functools import lru_cache, cache\n"
     "@functools.lru_cache(maxsize=None)\ndef pick(n):\n    return triton.next_power_of_2(n), 4\n"
     "@lru_cache(maxsize=128)\ndef warps(block):\n    return 8 if block >= 2048 else 4\n@cache\ndef grid(n, b):\n"
     "    return (triton.cdiv(n, b),)\n"),
    ("fresh-locals", "def launch(x, *args, **kwargs):\n    shape = list(x.shape)\n    shape[-1] = 4\n    a = [1]\n"
     "    a.append(2)\n    a += [3]\n    d = dict()\n    d['num_warps'] = kwargs.pop('num_warps', 4)\n    s = set()\n"
     "    s.add(1)\n    t = {k: v for k, v in kwargs.items()}\n    t.update(d)\n    b = bytearray(4)\n    b[0] = 1\n"
     "    rest = list(args)\n    rest.reverse()\n    grid = (1,) if x is None else [2]\n    out = None\n"
     "    out = torch.empty(shape, device=x.device)\n    out[..., :2] = 0\n    out.view(-1)[0] = 1\n"
     "    y = x.new_zeros(3)\n    y[0] = 1\n    c = x.clone()\n    c[0] = 0\n    return out, rest, grid\n"),
    ("fresh-iterators", "def first(kwargs, xs):\n    a = next(iter(kwargs.values()))\n    it = iter(xs)\n    b = next(it)\n"
     "    c = next((v for v in xs if v), None)\n    return a, b, c\n"),
    ("augmented-locals", "def blocks(n):\n    block = triton.next_power_of_2(n)\n    warps = max(1, block // 256)\n"
     "    warps *= 2\n    n += 1\n    block //= 2\n    return block, warps\n"),
    ("init-writes", "class RMSNorm:\n    def __init__(self, eps, n):\n        self.eps = eps\n        self._cache = {}\n"
     "        self.a, self.b = n, n * 2\n        self.shape: tuple = (n,)\n    def get(self, k):\n"
     "        return self._cache.get(k, self.eps)\n"),
    ("dataclass-config", "import dataclasses\nfrom dataclasses import dataclass, field\n@dataclass(frozen=True)\n"
     "class Cfg:\n    block: int = 128\n    extra: dict = field(default_factory=dict)\n"
     "@dataclass\nclass Mutable:\n    n: int = 0\n    def __post_init__(self):\n        self.n = max(self.n, 1)\n"
     "DEFAULT = Cfg()\ndef pick(n):\n    return dataclasses.replace(DEFAULT, block=n)\n"),
    ("autograd-ctx", "class Fn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x, eps):\n"
     "        ctx.eps = eps\n        ctx.save_for_backward(x)\n        ctx.mark_non_differentiable(x)\n        return x\n"
     "    @staticmethod\n    def backward(ctx, dy):\n        (x,) = ctx.saved_tensors\n        return dy, None\n"
     "def apply(x):\n    return Fn.apply(x, 1e-6)\n"),
    ("device-queries-at-import", "_HIP = torch.version.hip is not None\n_CAP = torch.cuda.get_device_capability() "
     "if torch.cuda.is_available() else (0, 0)\n_SMS = torch.cuda.get_device_properties(0).multi_processor_count "
     "if torch.cuda.is_available() else 1\n_MAX = torch.finfo(torch.float16).max\n_IMAX = torch.iinfo(torch.int32).max\n"
     "_DEV = torch.device('cpu')\n_MPS = torch.backends.mps.is_available()\n@torch.no_grad()\ndef g(x):\n    return x\n"),
    ("version-guard", "if triton.__version__ >= '3.0.0':\n    NEW = True\nelse:\n    NEW = False\nTV = torch.__version__\n"
     "from triton import __version__\nV = __version__\n"),
    ("iterators-consumed-at-import", "import itertools\nimport math\nimport functools\nimport operator\n"
     "CONFIGS = [triton.Config({'B': b}, num_warps=w) for b, w in itertools.product((64, 128), (4, 8))]\n"
     "KEYS = ('a', 'b')\nD = dict(zip(KEYS, (1, 2)))\nT = tuple(x * 2 for x in range(3))\nS = sum(x for x in range(3))\n"
     "M = max(len(k) for k in KEYS)\nJ = ''.join(str(i) for i in range(3))\nP = math.prod(x for x in (2, 3))\n"
     "R = functools.reduce(operator.mul, (x for x in (2, 3)), 1)\nE = list(enumerate(zip(KEYS, map(str, KEYS))))\n"
     "for i, k in enumerate(KEYS):\n    pass\nFIRST = next(iter(KEYS))\n"),
    ("generators-used-in-a-call", "def chunks(n, b):\n    yield from range(0, n, b)\n"
     "def launch(n):\n    return [c for c in chunks(n, 4)]\nfor c in chunks(8, 4):\n    pass\n"),
    ("tolist-item-synchronize", "def launch(x, positions):\n    idx = positions.tolist()\n    n = int(positions.max().item())\n"
     "    if x.is_cuda:\n        torch.cuda.synchronize()\n    torch.cuda.synchronize(x.device)\n    return idx, n\n"),
    ("kernel-body-locals", KERNEL),
    ("in-place-on-own-allocations", "def launch(a, b, n):\n    out = torch.empty(n)\n    out.zero_()\n"
     "    torch.add(a, b, out=out)\n    y = torch.empty_like(a).fill_(0)\n    y.copy_(a)\n    z = a.new_empty(n)\n"
     "    torch.Tensor.zero_(z)\n    return out, y, z\n"),
    ("data-ptr-alignment", "def aligned(x):\n    return x.data_ptr() % 16 == 0\n"),
    ("own-names-shadowing-builtins", "def f(id, hash):\n    return id + hash\n"),
]


@pytest.mark.parametrize("body", [h[1] for h in HONEST], ids=[h[0] for h in HONEST])
def test_honest_idioms_pass(body: str) -> None:
    result = check(body)
    assert result.ok, result.reason
