"""The static pre-check lets honest code through: the candidate corpus and the idioms kernels use.

The honest controls pass and the adversarial candidates meet the static check as their expectations
say; logging and contextlib are allowed imports; self/cls/ctx writes, match statements, str.format,
enums, triton helpers and tensor introspection pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelloop.kernels.candidate.static_check import ALLOWED_IMPORTS, static_check
from kernelloop.kernels.ops import get_op

from tests.sandbox_support import ARGS, HEADER, check

CANDIDATES = Path(__file__).parent / "sandbox_candidates"
CONTROLS = sorted(CANDIDATES.glob("control_*.py"))


@pytest.mark.parametrize("path", CONTROLS, ids=lambda p: p.stem)
def test_honest_candidates_pass(path: Path) -> None:
    from kernelloop.kernels.ops import get_op

    text = path.read_text()
    op = re.search(r"^# op:\s*(\w+)", text, re.M)
    assert static_check(text, get_op(op.group(1) if op else "rmsnorm").arg_names).ok


@pytest.mark.parametrize("path", sorted(CANDIDATES.glob("*.py")), ids=lambda p: p.stem)
def test_agrees_with_the_adversarial_expectations(path: Path) -> None:
    # Exploits the adversarial suite expects to be stopped later must get past the static check;
    # those it expects to stop before any process starts (`static=static`) must not.
    text = path.read_text()
    if re.search(r"^# expect:\s*registry-payload", text, re.M):
        pytest.skip("a registry payload, not a candidate (it never meets the static check)")
    expect = re.search(r"^# expect:\s*static=(\S+)", text, re.M)
    op = re.search(r"^# op:\s*(\w+)", text, re.M)
    result = static_check(text, get_op(op.group(1) if op else "rmsnorm").arg_names)
    if expect is None or "static" not in expect.group(1).split("|"):
        assert result.ok, result.reason
    elif expect.group(1) == "static" and result.ok:
        # the judge's other check before any process starts: the text that runs (kernels/candidate/canonical.py)
        from kernelloop.kernels.candidate.canonical import canonical_problem

        assert canonical_problem(text) is not None


def test_logging_and_contextlib_are_allowed_imports() -> None:
    assert {"logging", "contextlib"} <= ALLOWED_IMPORTS


@pytest.mark.parametrize("body", [
    "class K:\n    def __init__(self):\n        self._cache = {}\n    def f(self):\n        return self._cache\n",
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
    "class Cache:\n    hits = 0\n    _last = None\n    def __init__(self, key):\n        self._last = key\n        self.n: int = 0\n"
    "    def get(self, key):\n        return self._last, self.hits\n    @classmethod\n    def make(cls):\n"
    "        return cls(cls._last)\n    @staticmethod\n    def grid(meta):\n        return (meta['n'],)\n"
    "g = Cache.grid({'n': 1})\nc = Cache.make()\n",
    "import enum\nclass Mode(enum.Enum):\n    A = 1\nm = Mode.A\nt = type(m) is Mode\n",
    "class Fn(torch.autograd.Function):\n    @staticmethod\n    def setup_context(ctx, inputs, output):\n"
    "        ctx.n = len(inputs)\n",
])
def test_allowed_forms_pass(body: str) -> None:
    result = check(body)
    assert result.ok, result.reason
    assert static_check(HEADER + "def forward(x, weight, eps, *, flag=False):\n    return x\n", ARGS).ok
