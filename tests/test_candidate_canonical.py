"""One canonical text (kernels/candidate/canonical.py) and the interpreter's rebuild of a kernel from its
own definition, in its own globals (kernels/interpreter_rewrite.py): the code that runs is the code that
was checked, whichever of Triton's two rules reads it."""

from __future__ import annotations

import ast
import linecache
import types
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.candidate.canonical import CanonicalError, canonical, canonical_problem
from kernelloop.kernels.candidate.loader import load_kernel
from kernelloop.kernels.interpreter_rewrite import KernelTextError
from kernelloop.kernels.ops import get_op

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "sandbox_candidates"
HONEST = (CANDIDATES / "control_rmsnorm_row.py").read_text()
KERNEL = "def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):\n"


def _smuggle_in_docstring(name: str = "_row_kernel") -> str:
    """The honest kernel with a docstring holding another def of `name` that Triton's interpreter would build."""
    lines = HONEST.split(KERNEL)
    fake = KERNEL.replace("_row_kernel", name)
    smuggled = (f'    """Row kernel.\n    {fake}        tl.store(y_ptr, 0.0)\n        rest = \'\'\'\n    """\n')
    body = lines[1].replace("mask=mask)\n", "mask=mask)  # '''\n", 1)
    return lines[0] + KERNEL + smuggled + body


def _in_decorator() -> str:
    """A decorator argument holding a `def` line: the first `def name(` compiled Triton finds."""
    fake = f'@triton.jit(do_not_specialize=["""\n{KERNEL}    tl.store(y_ptr, 0.0)\n    rest = \'\'\'\n""" and "n_cols"])\n'
    head, body = HONEST.split("@triton.jit\n" + KERNEL)
    return head + fake + KERNEL + body.replace("mask=mask)\n", "mask=mask)  # '''\n", 1)


NESTED_SAME_NAME = HONEST.replace("    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)\n",
                                  "    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)\n\n"
                                  "    def _row_kernel(x_ptr):\n        return x_ptr\n")
IN_A_METHOD = HONEST + '''

class Helper:
    def launch(self, y_ptr):
        """Launch it.
        def launch(self, y_ptr):
            return 0
            rest = \'\'\'
        """
        return y_ptr  # \'\'\'
'''


@pytest.mark.parametrize("source, rule", [
    (_smuggle_in_docstring(), "interpreter"),
    (_in_decorator(), "compiled Triton"),
    (NESTED_SAME_NAME, "interpreter"),
    (IN_A_METHOD, "interpreter"),  # every def at any depth: any function object can be jitted
], ids=["docstring-def", "decorator-def", "nested-def-same-name", "method-docstring"])
def test_text_either_rule_would_read_differently_is_refused(source: str, rule: str) -> None:
    ast.parse(source)  # valid Python: only the extraction rules disagree with its AST
    with pytest.raises(CanonicalError, match=rule) as info:
        canonical(source)
    assert "\n" not in str(info.value) and str(info.value).startswith("line ")
    assert canonical_problem(source) == str(info.value)


def test_honest_text_with_def_lines_in_strings_and_docstrings_is_canonical() -> None:
    """A docstring example of another function, a def line in a string: no rule builds them for a kernel."""
    source = HONEST.replace(KERNEL, KERNEL + '    """Example:\n\n    def other(x):\n        return x\n    """\n') \
        + '\nUSAGE = """\ndef forward(x, w, eps):\n"""\n'
    canon = canonical(source)
    assert '"""' not in canon.text  # docstrings dropped; the one multi-line string kept, one line
    assert "USAGE = '\\ndef forward(x, w, eps):\\n'" in canon.text


def test_canonical_text_is_the_checked_program_without_comments_or_docstrings() -> None:
    source = '"""Module doc."""\n# a comment\nimport triton  # why\n\n\ndef f(x):\n    """Doc."""\n\n    return x  # same\n\n\ndef g():\n    """Only a doc."""\n'
    canon = canonical(source)
    assert canon.text == "import triton\n\ndef f(x):\n    return x\n\ndef g():\n    pass\n"
    assert canon.label == f"<kernelloop_kernel {canon.sha256[:12]}>"
    assert canonical(source.replace("# why", "# other")).sha256 == canon.sha256  # comments do not change it


@pytest.mark.parametrize("source, message", [
    ("def forward(:\n", "line 1: the source does not compile"),
    ("x = 1\0\n", "does not compile"),
    ("(" * 300 + ")" * 300, "too deeply nested|does not compile"),
    ("return 1\n", "does not compile"),
])
def test_a_source_without_canonical_text_is_one_line(source: str, message: str) -> None:
    for _ in range(2):  # remembered refusals are refused alike
        with pytest.raises(CanonicalError, match=message) as info:
            canonical(source)
        assert "\n" not in str(info.value)


def test_a_remembered_text_gives_every_caller_a_tree_of_its_own() -> None:
    first = canonical(HONEST)
    first.tree.body.clear()  # a caller that changes its tree changes nobody else's
    second = canonical(HONEST)
    assert second.text == first.text and second.tree.body and second.tree is not first.tree
    assert ast.dump(second.tree) == ast.dump(ast.parse(second.text))


@pytest.mark.parametrize("path", sorted(REPO.glob("kernels/ops/*_kernel.py")) + sorted(CANDIDATES.glob("control_*.py")),
                         ids=lambda p: p.stem)
def test_every_baseline_and_control_is_canonical_with_the_same_functions(path: Path) -> None:
    source = path.read_text()
    canon = canonical(source)
    names = sorted(n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    assert sorted(n.name for n in ast.walk(canon.tree) if isinstance(n, ast.FunctionDef)) == names


# -- the interpreter's rebuild (the second layer, without the canonical check) ---------------------------

def _exec_raw(source: str, label: str) -> dict:
    """A module executed from `source` as written (what no loader does any more), its text in linecache."""
    linecache.cache[label] = (len(source), None, source.splitlines(keepends=True), label)
    module = types.ModuleType("raw_kernel_module")
    exec(compile(source, label, "exec"), module.__dict__)
    return module.__dict__


def test_the_interpreter_builds_a_kernel_from_its_own_definition_only() -> None:
    """Triton's interpreter would have run the docstring's body (it stores 0.0); the rewrite runs the def's."""
    spec = get_op("rmsnorm")
    args = spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu")
    namespace = _exec_raw(_smuggle_in_docstring(), "<raw smuggled kernel>")
    torch.testing.assert_close(namespace["forward"](*args), spec.reference(*args), atol=1e-5, rtol=1e-5)
    lam = _exec_raw("import triton\nk = triton.jit(lambda x_ptr: x_ptr)\n", "<raw lambda kernel>")["k"]
    with pytest.raises(Exception) as info:
        lam[(1,)](torch.zeros(1))
    assert isinstance(info.value, KernelTextError) or isinstance(info.value.__cause__, KernelTextError), info.value


def test_a_launch_writes_nothing_into_the_kernels_module() -> None:
    """Triton's own rewrite copied the interpreter's globals (inspect, np, ...) into the module at the first launch."""
    spec = get_op("rmsnorm")
    loaded = load_kernel(HONEST, spec.arg_names)
    before = dict(loaded.namespace)
    out = loaded.forward(*spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu"))
    assert isinstance(out, torch.Tensor)
    assert loaded.namespace == before and "inspect" not in loaded.namespace and "np" not in loaded.namespace


def test_a_kernel_naming_the_interpreters_own_names_is_refused() -> None:
    source = HONEST.replace("    row = tl.program_id(0).to(tl.int64)\n",
                            "    row = tl.program_id(0).to(tl.int64)\n    interpreter_semantic = row\n", 1)
    spec = get_op("rmsnorm")
    forward = _exec_raw(source, "<raw reserved name>")["forward"]
    with pytest.raises(Exception, match="reserves"):
        forward(*spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu"))
