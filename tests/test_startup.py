"""Parsing the command line of `agent` and `engine` imports neither torch nor Triton (`--help` stays fast);
whatever loads kernels configures Triton first (interpreter without CUDA), since `import kernelloop.kernels`
does not.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "triton", "numpy", "sqlite_utils", "git", "langgraph", "fastapi")


def _python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cli", ["agent", "engine"])
def test_parsing_every_command_line_loads_no_heavy_module(cli):
    code = (f"import sys\nfrom kernelloop.{cli}.cli import build_parser\n"
            "parser = build_parser()\n"
            "for action in parser._subparsers._group_actions:\n"
            "    for name, sub in action.choices.items():\n"
            "        sub.format_help()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"`{cli} --help` imports {result.stdout.strip()}"


def test_the_op_table_configures_triton_before_any_kernel_exists():
    code = ("import os\nfrom kernelloop.kernels import get_op\nget_op('rmsnorm')\n"
            "import torch\nprint(torch.cuda.is_available(), os.environ.get('TRITON_INTERPRET'))\n")
    result = _python(code, TRITON_INTERPRET=None)
    assert result.returncode == 0, result.stderr[-2000:]
    cuda, interpret = result.stdout.split()
    assert interpret == ("None" if cuda == "True" else "1")


def test_a_registry_source_is_loaded_with_triton_configured():
    code = ("import os\nfrom kernelloop.kernels.registry.loader import load_forward\n"
            "from kernelloop.kernels.registry.entry import sha256_text\n"
            "source = 'import triton\\n\\n@triton.jit\\ndef k(x):\\n    pass\\n\\n"
            "def forward(x):\\n    return k\\n'\n"
            "kernel = load_forward(source, sha256_text(source), 'test')(None)\n"
            "print(type(kernel).__name__, os.environ.get('TRITON_INTERPRET'))\n"
            "import torch\nprint(torch.cuda.is_available())\n")
    result = _python(code, TRITON_INTERPRET=None)
    assert result.returncode == 0, result.stderr[-2000:]
    first, cuda = result.stdout.splitlines()
    kind, interpret = first.split()
    if cuda == "False":
        assert (kind, interpret) == ("InterpretedFunction", "1")


def test_lazy_package_exports_are_what_they_name_after_every_submodule_is_loaded():
    # `from kernelloop.sandbox import static_check` once returned the submodule of that name (the
    # rehearsal of bench/sandbox_gpu.py caught it: "'module' object is not callable").
    code = ("import importlib, pkgutil, types\n"
            "import kernelloop.sandbox as sb, kernelloop.kernels as kn\n"
            "for pkg in (sb, kn):\n"
            "    for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(info.name)\n"
            "    for name in pkg.__all__:\n"
            "        value = getattr(pkg, name)\n"
            "        assert not isinstance(value, types.ModuleType), (pkg.__name__, name)\n"
            "from kernelloop.sandbox import static_check\n"
            "print(static_check('def forward(x):\\n    return x\\n', ('x',)).ok is not None)\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "True"
