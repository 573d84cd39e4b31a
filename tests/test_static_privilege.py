"""Private attributes: a method's self/cls reads private attributes only where it can
never be bound to anything but its class's instances (or the class), so `self._x` can never reach a
module's private objects (torch._import_dotted_name, the interpreter's globals, torch._C).

Every planted case defines `_reach` in its class, so the read names the class's own attribute and only
the rule on the first parameter can stop it; each hands the class or the raw function out by another
way. The honest forms (instances, isinstance, subclasses, constants, classmethods, properties, zero-arg
super, pass-through decorators, autograd Functions through .apply, dataclasses) keep their privilege.
"""

from __future__ import annotations

import pytest

from tests.sandbox_support import check

K = "class K:\n    _reach = None\n    def f(self):\n        return self._reach\n"  # lines 4-7
PRIVATE_READ = "private attribute access ._reach is not allowed"

BYPASSES = [
    ("alias", K + "J = K\nJ.f(torch)\n", "`K` is assigned at line 8"),
    ("walrus", K + "def g():\n    return (J := K).f(torch)\n", "`K` is assigned"),
    ("tuple-item", K + "x = (K,)[0].f(torch)\n", "put in a container"),
    ("list-item", K + "x = [K][0].f(torch)\n", "put in a container"),
    ("dict-value", K + "x = {'k': K}['k'].f(torch)\n", "put in a container"),
    ("starred", K + "x = [*[K]][0].f(torch)\n", "put in a container"),
    ("conditional", K + "x = (K if torch else None).f(torch)\n", "used as a value"),
    ("default-argument", K + "def g(c=K):\n    return c.f(torch)\n", "a default argument"),
    ("lambda-default", K + "g = lambda c=K: c.f(torch)\n", "a default argument"),
    ("return-value", K + "def g():\n    return K\nx = g().f(torch)\n", "returned"),
    ("passed-to-a-call", K + "def g(c):\n    return c.f(torch)\nx = g(K)\n", "passed to a call"),
    ("partial", K + "import functools\nx = functools.partial(lambda c: c.f(torch), K)()\n", "passed to a call"),
    ("subscripted", K + "x = K[0]\n", "subscripted"),
    ("subclass-alias", K + "class B(K):\n    pass\nJ = B\nJ.f(torch)\n", "(through its subclass B)"),
    ("deep-subclass", K + "class B(K):\n    pass\nclass C(B):\n    pass\nx = [C]\n", "(through its subclass B)"),
    ("super-with-arguments", K + "class B(K):\n    pass\nx = super(B, B).f(torch)\n", "passed to a call"),
    ("rebound-name", K + "K = K\n", "also bound at line 8"),
    ("deleted-name", K + "del K\n", "also bound"),
    ("rebound-isinstance", K + "isinstance = lambda a, b: b\nx = isinstance(0, K).f(torch)\n", "passed to a call"),
    ("class-keyword", K + "class B(K, flag=torch):\n    pass\n", "class B has class keywords (through its subclass B)"),
    ("class-decorator", "def deco(c):\n    return c\n@deco\n" + K, "has a decorator that receives the class"),
    ("nested-class", "class O:\n    class K:\n        _reach = None\n        def f(self):\n            return self._reach\n"
     "x = O.K.f(torch)\n", "defined inside another class"),
    ("class-annotation", "import dataclasses\n" + K + "@dataclasses.dataclass\nclass H:\n    k: K = None\n",
     "kept in a class-level annotation"),
    ("staticmethod-rebind", "class K:\n    _reach = None\n    def f(self):\n        return self._reach\n"
     "    f = staticmethod(f)\n", "the function f is read in the class body at line 8"),
    ("alias-in-body", "class K:\n    _reach = None\n    def f(self):\n        return self._reach\n    g = f\n",
     "read in the class body"),
    ("property-of-it", "class K:\n    _reach = None\n    def f(self):\n        return self._reach\n    p = property(f)\n",
     "read in the class body"),
    ("decorator-calls-raw", "def deco(fn):\n    return lambda *a: fn(torch)\nclass K:\n    _reach = None\n    @deco\n"
     "    def f(self):\n        return self._reach\n", "decorated by `deco`, which receives the raw function"),
    ("wrapper-passes-another-first", "def deco(fn):\n    def w(ctx, *a):\n        return fn(torch, *a)\n    return w\n"
     "class K:\n    _reach = None\n    @deco\n    def f(self):\n        return self._reach\n", "decorated by `deco`"),
    ("wrapper-rebinds-its-first", "def deco(fn):\n    def w(ctx, *a):\n        ctx = torch\n        return fn(ctx, *a)\n"
     "    return w\nclass K:\n    _reach = None\n    @deco\n    def f(self):\n        return self._reach\n", "`deco`"),
    ("wrapper-made-static", "def deco(fn):\n    def w(ctx):\n        return fn(ctx)\n    return staticmethod(w)\n"
     "class K:\n    _reach = None\n    @deco\n    def f(self):\n        return self._reach\n", "`deco`"),
    ("wrapper-called-inside", "def deco(fn):\n    def w(ctx):\n        return fn(ctx)\n    w(torch)\n    return w\n"
     "class K:\n    _reach = None\n    @deco\n    def f(self):\n        return self._reach\n", "`deco`"),
    ("decorator-factory", "def deco(n):\n    return lambda fn: fn\nclass K:\n    _reach = None\n    @deco(1)\n"
     "    def f(self):\n        return self._reach\n", "decorated by `deco`"),
    ("first-parameter-default", "class K:\n    _reach = None\n    def f(self=torch):\n        return self._reach\n",
     "has a default"),
    ("autograd-instantiated", "class Fn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        ctx.allclose = None\n        return x\nx = Fn().forward(torch, 1)\n", "`Fn` is called"),
]

NEVER_PRIVILEGED = [
    ("undefined-private", "class K:\n    def f(self):\n        return self._C\n", 6,
     "self may read only the private attributes class K defines"),
    ("ctx-private", "class Fn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        return ctx._forward_cls\n", 7, "ctx is torch's object"),
    ("static-forward-outside-autograd", "class K:\n    _reach = None\n    @staticmethod\n    def forward(ctx):\n"
     "        return ctx._reach\nx = K().forward(torch)\n", 8, "private attribute access ._reach"),
    ("lambda-in-class-body", "class K:\n    _reach = None\n    g = lambda self: self._reach\n", 6, PRIVATE_READ),
    ("nested-def-in-method", "class K:\n    _reach = None\n    def f(self):\n        def g(s):\n            return s._reach\n"
     "        return g\n", 8, PRIVATE_READ),
    ("attached-later", "def f(self):\n    return self._reach\n", 5, PRIVATE_READ),
    ("super-in-classmethod", "class K:\n    _reach = None\n    def f(self):\n        return self._reach\n"
     "class B(K):\n    @classmethod\n    def g(cls):\n        return super().f(torch)\n", 11, "`super` is allowed only"),
    ("super-in-lambda", "class K:\n    _reach = None\n    def f(self):\n        return lambda t: super().f(t)\n", 7,
     "`super` is allowed only"),
    ("super-in-staticmethod", "class K:\n    @staticmethod\n    def f():\n        return super()\n", 7, "`super`"),
    ("type-kept", K + "k = K()\nt = type(k)\nx = t.f(torch)\n", 9, "type(x) in a comparison"),
    ("type-passed", K + "x = isinstance(torch, type(K()))\n", 8, "type(x) in a comparison"),
    ("method-through-class", K + "x = K.f(torch)\n", 7, "`K` is its method K.f read through the class at line 8"),
    ("descriptor-owner", "class D:\n    def __get__(self, obj, objtype=None):\n        return objtype.f(torch)\n" + K.replace(
        "    _reach = None\n", "    _reach = None\n    d = D()\n"), 6, "`objtype` holds a class"),
    ("set-name-owner", "class D:\n    def __set_name__(self, owner, name):\n        owner.f(torch)\n", 6,
     "`owner` holds a class"),
    ("exit-exception-class", "class C:\n    def __exit__(self, et, ev, tb):\n        return et.f(torch)\n", 6,
     "`et` holds a class"),
    ("mro-entries", "class D:\n    def __mro_entries__(self, bases):\n        return bases\n", 5,
     "defining __mro_entries__ is not allowed"),
    ("subclasshook", "class D:\n    @classmethod\n    def __subclasshook__(cls, other):\n        return True\n", 6,
     "defining __subclasshook__"),
    ("finalizer", "class D:\n    def __del__(self):\n        pass\n", 5, "defining __del__"),
    ("external-base", "class K(torch.nn.Module):\n    _reach = None\n    def f(self):\n        return self._reach\n", 7,
     "class K inherits from torch.nn.Module, whose private attributes self could reach"),
    ("external-base-of-a-base", "class A(Exception):\n    pass\nclass K(A):\n    _reach = None\n    def f(self):\n"
     "        return self._reach\n", 9, "inherits from Exception"),
    ("cls-reads-an-instance-name", "class K:\n    def __init__(self):\n        self._n = 1\n    @classmethod\n"
     "    def f(cls):\n        return cls._n\n", 9, "cls may read only the private attributes class K defines"),
    ("metaclass", "class M(type):\n    _reach = None\n    def f(cls):\n        return cls._reach\n"
     "class K(metaclass=M):\n    pass\n", 4, "`type` is allowed only as type(x) in a comparison"),
]


@pytest.mark.parametrize("body, why", [b[1:] for b in BYPASSES], ids=[b[0] for b in BYPASSES])
def test_handing_the_class_or_the_function_out_ends_the_privilege(body: str, why: str) -> None:
    result = check(body)
    assert not result.ok
    assert ("is not allowed" in result.reason and "is not privileged" in result.reason
            and why in result.reason), result.reason


@pytest.mark.parametrize("body, line, words", [b[1:] for b in NEVER_PRIVILEGED], ids=[b[0] for b in NEVER_PRIVILEGED])
def test_first_parameters_that_were_never_privileged(body: str, line: int, words: str) -> None:
    result = check(body)
    assert not result.ok
    assert result.reason.startswith(f"line {line}:") and words in result.reason, result.reason


HONEST = [
    ("instances-and-queries", "class K:\n    LIMIT = 4\n    def __init__(self, n):\n        self._n = n\n"
     "    def f(self):\n        return self._n + self._helper()\n    def _helper(self):\n        return self.LIMIT\n"
     "k = K(1)\nok = isinstance(k, K) and issubclass(K, object) and isinstance(k, (K, int)) and type(k) is K\n"
     "m = K.LIMIT\ntry:\n    pass\nexcept (K, ValueError):\n    pass\n"),
    ("subclasses", "class K:\n    def __init__(self):\n        self._n = 1\n    def f(self):\n        return self._n\n"
     "class B(K):\n    def g(self):\n        return self._n + super().f()\nb = B()\n"),
    ("classmethods-and-properties", "class K:\n    _registry = ()\n    def __init__(self, n):\n        self._n = n\n"
     "    @classmethod\n    def make(cls):\n        return cls(len(cls._registry))\n    @property\n    def n(self):\n"
     "        return self._n\nk = K.make()\n"),
    ("annotations", "class K:\n    def __init__(self):\n        self._n = 1\n    def f(self):\n        return self._n\n"
     "def g(x: K) -> K:\n    y: K = x\n    return y\n"),
    ("future-annotations-in-dataclass", "from __future__ import annotations\nimport dataclasses\n"
     "class K:\n    def __init__(self):\n        self._n = 1\n    def f(self):\n        return self._n\n"
     "@dataclasses.dataclass\nclass H:\n    k: K | None = None\n"),
    ("dataclass-private-field", "from dataclasses import dataclass, field\n@dataclass(frozen=True)\nclass Cfg:\n"
     "    block: int = 128\n    _extra: dict = field(default_factory=dict)\n    def get(self, k):\n"
     "        return self._extra.get(k)\n"),
    ("cached-method-and-no-grad", "import functools\nclass K:\n    def __init__(self):\n        self._n = 1\n"
     "    @functools.lru_cache(maxsize=None)\n    def f(self, m):\n        return self._n * m\n    @torch.no_grad()\n"
     "    def g(self):\n        return self._n\n"),
    ("pass-through-decorators", "import functools\ndef keep(fn):\n    return fn\ndef contiguous(fn):\n"
     "    @functools.wraps(fn)\n    def wrapper(ctx, *args, **kwargs):\n        args = [a for a in args]\n"
     "        return fn(ctx, *args, **kwargs)\n    return wrapper\nclass Fn(torch.autograd.Function):\n"
     "    @staticmethod\n    @contiguous\n    def forward(ctx, x, eps):\n        ctx.eps = eps\n        return x\n"
     "class K:\n    def __init__(self):\n        self._n = 1\n    @keep\n    def f(self):\n        return self._n\n"
     "def run(x):\n    return Fn.apply(x, 1e-6)\n"),
    ("protocol-classes-compared", "class C:\n    def __enter__(self):\n        return self\n"
     "    def __exit__(self, et, ev, tb):\n        return et is not None and issubclass(et, ValueError)\n"
     "class D:\n    def __get__(self, obj, objtype=None):\n        return 1 if obj is None else 2\n"),
    ("object-base", "class K(object):\n    _x = 1\n    def f(self):\n        return self._x\n"),
    ("enum-with-methods", "import enum\nclass Mode(enum.Enum):\n    A = 1\n    B = 2\n    def wide(self):\n"
     "        return self is Mode.B\nm = Mode.A.wide() or Mode(2).wide()\n"),
]


@pytest.mark.parametrize("body", [h[1] for h in HONEST], ids=[h[0] for h in HONEST])
def test_honest_classes_keep_their_privilege(body: str) -> None:
    result = check(body)
    assert result.ok, result.reason
