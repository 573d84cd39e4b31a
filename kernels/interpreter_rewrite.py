"""How Triton's CPU interpreter rebuilds a kernel, made safe: from the function's own definition, in
globals that are not its module's.

Triton's interpreter (`FunctionRewriter.rewrite_ast`, Triton 3.x) re-reads a kernel's text with
`inspect.getsourcelines`, starts at the *last* line beginning with `def ` (a docstring or string
line can be that line), and execs the result in the function's module dict after copying its own
module globals into it (`inspect`, `np`, `builtins`...: every kernel module gains them at its first
launch). `install()` replaces that method:

* the text is the function's whole block (decorators included) parsed as a module, which must be
  exactly one `def` with the function's name whose lines are the function's own code object's
  (`co_firstlineno`); anything else raises KernelTextError (kernels/candidate/canonical.py refuses
  such sources before they run, this is the second layer);
* the rewritten def is exec'd in `KernelGlobals`: a dict holding only the interpreter names Triton's
  AST transformer adds (e.g. `interpreter_semantic`) and the module's `__builtins__`, reading every
  other global through to the module's live dict; nothing is written into the module. A kernel
  that names one of those interpreter names itself is refused.

Installed by kernels/interpreter_fidelity.py's `patch_interpreter()` (not switched off with the
fidelity patch: it is a safety layer).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable

INSTALLED = False
_KNOWN = frozenset({"interpreter_semantic", "_InterpreterComparison"})  # what Triton 3.x's ASTTransformer adds


class KernelTextError(RuntimeError):
    """The text Triton would rebuild a kernel from is not that kernel's own definition."""


class KernelGlobals(dict):
    """A rebuilt kernel's globals: the few interpreter names it needs, then its module's live dict."""

    __slots__ = ("module",)

    def __init__(self, module: dict[str, Any], own: dict[str, Any]) -> None:
        super().__init__(own)
        self.module = module
        self["__builtins__"] = module.get("__builtins__", {})  # read directly, never through __missing__

    def __missing__(self, key: str) -> Any:
        return self.module[key]

    # Triton's _patch_lang (and the fidelity patch's libdevice rebinding) read a kernel's globals as a
    # mapping: they see the module's names; what they write shadows them here, never in the module.
    def _merged(self) -> dict[str, Any]:
        return {**self.module, **dict(super().items())}

    def items(self) -> Any:
        return self._merged().items()

    def keys(self) -> Any:
        return self._merged().keys()

    def values(self) -> Any:
        return self._merged().values()

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self.module

    def __iter__(self) -> Any:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())


def install() -> None:
    """Replace FunctionRewriter.rewrite_ast; idempotent."""
    global INSTALLED
    if INSTALLED:
        return
    import triton.runtime.interpreter as interp

    interp.FunctionRewriter.rewrite_ast = _rewriter(interp)
    INSTALLED = True


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _rewriter(interp: Any) -> Callable[[Any], Callable]:
    def rewrite_ast(self: Any) -> Callable:
        fn = self.fn
        try:
            lines, first = inspect.getsourcelines(fn)
        except Exception:  # noqa: BLE001 (no source: Triton runs the function as it is, so do we)
            return fn
        name = getattr(fn, "__name__", "?")
        try:
            body = ast.parse(textwrap.dedent("".join(lines))).body
        except SyntaxError:
            body = []
        code = getattr(fn, "__code__", None)
        if len(body) != 1 or not isinstance(body[0], ast.FunctionDef) or body[0].name != name \
                or code is None or code.co_firstlineno != first or code.co_name != name:
            raise KernelTextError(f"kernel {name}: the text Triton would rebuild it from is not its own definition")
        tree = ast.Module(body=body, type_ignores=[])
        body[0].decorator_list = []
        before = _names(tree)
        transformed = self.ast_transformer.visit(tree)
        ast.fix_missing_locations(transformed)
        ast.increment_lineno(transformed, first - 1)
        module_globals = vars(interp)
        added = (_names(transformed) - before) | _KNOWN
        if before & added:
            raise KernelTextError(f"kernel {name}: it names {sorted(before & added)[0]!r}, which the interpreter reserves")
        own = {key: module_globals[key] for key in added if key in module_globals}
        namespace = KernelGlobals(fn.__globals__, own)
        local_namespace = {**self.kwargs}
        exec(compile(transformed, filename=code.co_filename, mode="exec"), namespace, local_namespace)
        return local_namespace[name]

    return rewrite_ast
