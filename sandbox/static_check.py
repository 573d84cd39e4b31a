"""Static pre-check of a candidate's source, before any process starts.

A cheap first wall, not the only one: the runtime guards (sandbox/guards.py) hold by themselves.
The first problem found (lowest line) is reported as `line N: ...`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Module roots a candidate may import; everything else (os, sys, subprocess, socket, ctypes,
# threading, multiprocessing, importlib, gc, time, numpy, ...) is refused.
ALLOWED_IMPORTS = frozenset({
    "torch", "triton", "math", "functools", "typing", "__future__", "dataclasses", "itertools", "operator",
    "enum",
})
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars",
    "__import__", "breakpoint", "input", "exit", "quit", "SystemExit", "memoryview", "help",
})
# Attributes that reach compilers, raw memory, other streams, serialization or torch internals.
FORBIDDEN_ATTRIBUTES = frozenset({
    "cpp_extension", "load_inline", "library", "Stream", "stream", "set_stream", "ExternalStream",
    "numpy", "tolist", "compile", "ops", "hub", "from_file", "frombuffer", "from_numpy",
    "from_dlpack", "storage", "untyped_storage", "set_", "CUDAGraph", "graph", "jiterator",
    "cudart", "synchronize", "Event",
    # modules other modules re-export (torch.os, torch.sys, ...)
    "os", "sys", "subprocess", "socket", "ctypes", "threading", "multiprocessing", "importlib", "builtins",
    "gc", "inspect", "shutil", "pathlib", "signal", "pickle", "marshal", "time",
})
MAX_SOURCE_BYTES = 200_000


@dataclass(frozen=True)
class StaticResult:
    ok: bool
    reason: str = ""
    line: int = 0


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[tuple[int, str]] = []
        self.module_aliases: set[str] = set()

    def flag(self, node: ast.AST, message: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), message))

    def _check_module(self, node: ast.AST, module: str) -> None:
        if module.split(".")[0] not in ALLOWED_IMPORTS:
            self.flag(node, f"import of {module!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            self.module_aliases.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag(node, "relative imports are not allowed")
        else:
            self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.flag(node, "`import *` is not allowed")
            self.module_aliases.add(alias.asname or alias.name)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.flag(node, f"use of {node.id!r} is not allowed")
        elif _dunder(node.id) and node.id != "__name__":
            self.flag(node, f"use of {node.id!r} is not allowed")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        base_is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
        if _dunder(name):
            self.flag(node, f"dunder attribute access .{name} is not allowed")
        elif name.startswith("_") and not base_is_self:
            self.flag(node, f"private attribute access .{name} is not allowed")
        elif name in FORBIDDEN_ATTRIBUTES:
            self.flag(node, f"attribute .{name} is not allowed")
        self.generic_visit(node)

    def _check_targets(self, targets: list[ast.AST]) -> None:
        # Attribute assignment only on `self`: anything else may be a module reached through a variable.
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                    what = "monkeypatching a module" if _root_name(node) in self.module_aliases else "only self.<name> may be set"
                    self.flag(node, f"assigning to {ast.unparse(node)} ({what}) is not allowed")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_targets(node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_targets([node.target])
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_targets([node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_targets(node.targets)
        self.generic_visit(node)


def _check_forward(tree: ast.Module, arg_names: tuple[str, ...]) -> tuple[int, str] | None:
    forwards = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"]
    if not forwards:
        return 0, "no top-level `def forward(...)`"
    fn = forwards[-1]
    if isinstance(fn, ast.AsyncFunctionDef):
        return fn.lineno, "forward must not be async"
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required_kwonly = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if required_kwonly:
        return fn.lineno, f"forward has required keyword-only arguments {required_kwonly}"
    if a.vararg is None and positional != len(arg_names):
        return fn.lineno, (f"forward takes {positional} positional arguments, the op passes "
                           f"{len(arg_names)} ({', '.join(arg_names)})")
    return None


def static_check(source: str, arg_names: tuple[str, ...]) -> StaticResult:
    """Syntax, `forward` and its signature, forbidden imports, names and attributes."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        return StaticResult(False, f"source is larger than {MAX_SOURCE_BYTES} bytes")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return StaticResult(False, f"line {exc.lineno}: syntax error: {exc.msg}", exc.lineno or 0)
    visitor = _Visitor()
    visitor.visit(tree)
    problems = sorted(visitor.problems)
    forward_problem = _check_forward(tree, arg_names)
    if forward_problem:
        problems.append(forward_problem)
    if not problems:
        return StaticResult(True)
    line, message = problems[0]
    return StaticResult(False, f"line {line}: {message}" if line else message, line)
