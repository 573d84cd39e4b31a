"""The static pre-check: forbidden code is refused with its line number; honest code passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.static_check import static_check

ARGS = ("x", "weight", "eps")
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"


CONTROLS = sorted((Path(__file__).parent / "sandbox_candidates").glob("control_*.py"))


@pytest.mark.parametrize("path", CONTROLS, ids=lambda p: p.stem)
def test_honest_candidates_pass(path: Path) -> None:
    assert static_check(path.read_text(), ARGS if "rmsnorm" in path.stem else ("x",)).ok


def test_allowed_forms_pass() -> None:
    assert static_check(HEADER + "\ndef forward(x, weight, eps):\n    return x\n", ARGS).ok
    assert static_check(HEADER + "class K:\n    def f(self):\n        return self._cache\n"
                        "def forward(x, weight, eps, *, flag=False):\n    return x\n", ARGS).ok


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
    ("t = torch\nt.allclose = None", 5, "only self."),
    ("torch.utils.cpp_extension.load_inline('x', '')", 4, ".cpp_extension"),
    ("s = torch.cuda.Stream()", 4, ".Stream"),
    ("v = torch.ones(2).tolist()", 4, ".tolist"),
    ("raise SystemExit(0)", 4, "'SystemExit'"),
    ("b = __builtins__", 4, "'__builtins__'"),
])
def test_forbidden_code_is_refused_with_its_line(body: str, line: int, words: str) -> None:
    result = static_check(HEADER + body + "\ndef forward(x, weight, eps):\n    return x\n", ARGS)
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
    result = static_check(HEADER + "x = 1\nimport socket\nimport os\ndef forward(x, weight, eps):\n    return x\n", ARGS)
    assert result.reason.startswith("line 5:") and "socket" in result.reason
