"""Static pre-check of a candidate's source, before any process starts.

A cheap first wall, not the only one: the runtime guards (sandbox/guards.py) hold by themselves.
Imported names are checked like attributes. Attributes are written (and private ones read) only
through a method's own first parameter: self/cls, or the ctx of an autograd Function's static
forward/backward. The first problem found (lowest line) is reported as `line N: ...`.
"""

from __future__ import annotations

import ast
import builtins
import re
import string
from dataclasses import dataclass
from typing import Iterator

# Module roots a candidate may import; everything else (os, sys, subprocess, socket, ctypes,
# threading, multiprocessing, importlib, gc, time, numpy, ...) is refused.
ALLOWED_IMPORTS = frozenset({
    "torch", "triton", "math", "functools", "typing", "__future__", "dataclasses", "itertools", "operator",
    "enum", "logging", "contextlib",
})
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars", "dir",
    "__import__", "breakpoint", "input", "exit", "quit", "SystemExit", "memoryview", "help",
})
# Attribute names, and names imported with `from X import name`, that are refused wherever they appear.
FORBIDDEN_ATTRIBUTES = frozenset({
    # compilers, raw memory, other streams, serialization, torch and triton internals
    "cpp_extension", "load_inline", "library", "Stream", "stream", "set_stream", "ExternalStream",
    "numpy", "tolist", "compile", "ops", "hub", "from_file", "frombuffer", "from_numpy",
    "from_dlpack", "storage", "untyped_storage", "set_", "CUDAGraph", "graph", "jiterator",
    "cudart", "synchronize", "Event", "serialization", "driver", "build", "knobs", "compile_module_from_src",
    "compile_module_from_file", "compile_so_from_src", "compile_so_from_file", "get_cache_manager",
    # modules other modules re-export (torch.os, logging.sys, triton.runtime.build.subprocess, ...)
    "os", "sys", "subprocess", "socket", "ctypes", "threading", "multiprocessing", "importlib", "builtins",
    "gc", "inspect", "shutil", "pathlib", "signal", "pickle", "marshal", "time", "io", "types", "traceback",
    "tempfile", "pkgutil", "runpy", "module_from_spec", "config", "handlers", "FileHandler", "chdir",
    # string-driven attribute access and evaluation
    "attrgetter", "methodcaller", "get_type_hints", "currentframe", "update_wrapper", "singledispatch",
    "singledispatchmethod",
    # frames, tracebacks, code objects, class graphs
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
    "ag_await", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next",
    "co_code", "co_consts", "co_names", "func_globals", "func_code", "mro", "subclasses",
})
# Dotted names refused where the root is an imported module (unpickling runs arbitrary code).
FORBIDDEN_QUALIFIED = frozenset({"torch.load", "torch.save", "torch.jit.load", "torch.jit.save"})
# Static methods of a torch.autograd.Function whose first parameter `ctx` may be written to.
AUTOGRAD_METHODS = frozenset({"forward", "backward", "setup_context", "jvp", "vjp"})
MAX_SOURCE_BYTES = 200_000


@dataclass(frozen=True)
class StaticResult:
    ok: bool
    reason: str = ""
    line: int = 0


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _name_problem(name: str, private_ok: bool = False) -> str | None:
    if _dunder(name):
        return f"dunder attribute access .{name} is not allowed"
    if name.startswith("_") and not private_ok:
        return f"private attribute access .{name} is not allowed"
    if name in FORBIDDEN_ATTRIBUTES:
        return f"attribute .{name} is not allowed"
    return None


def _format_fields(text: str) -> list[str] | None:
    """The field names of a str.format template, nested specs included; None if it is not one."""
    fields: list[str] = []
    try:
        for _, field, spec, _ in string.Formatter().parse(text):
            if field is not None:
                nested = _format_fields(spec or "")
                if nested is None:
                    return None
                fields += [field, *nested]
    except ValueError:
        return None
    return fields


def _decorated(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in fn.decorator_list)


def _owner_param(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The first parameter of a def sitting directly in a class body, when it is self/cls/ctx-like."""
    params = fn.args.posonlyargs + fn.args.args
    if not params:
        return None
    if _decorated(fn, "staticmethod"):
        return "ctx" if params[0].arg == "ctx" and fn.name in AUTOGRAD_METHODS else None
    return params[0].arg


def _bindings(body: list[ast.stmt]) -> Iterator[tuple[ast.AST, str]]:
    """Every (node, name) that binds or deletes a plain name anywhere in `body`."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                yield node, node.id
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield node, node.name
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                yield node, node.name
            elif isinstance(node, ast.MatchMapping) and node.rest:
                yield node, node.rest
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    yield node, alias.asname or alias.name.split(".")[0]


class _Visitor(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.problems: list[tuple[int, int, int, str]] = []  # line, column, end column, message
        self.modules: dict[str, str] = {}  # local name -> the dotted name it was imported as
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules.update((a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2 for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                self.modules.update((a.asname or a.name, f"{node.module}.{a.name}") for a in node.names)
        # Per enclosing function: the parameter it may write to, and whether it is a classmethod's cls.
        self.owners: list[tuple[str | None, bool]] = []
        self.allowed_calls: set[int] = set()  # type(x) and decorator calls (`@functools.wraps(fn)`)
        # Methods whose self/ctx could be handed a module if read through a class (`K.f(torch)`).
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        self.classes = {c.name for c in classes}
        defs = [f for c in classes for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.methods = {f.name for f in defs if _owner_param(f) and not _decorated(f, "classmethod")}

    def flag(self, node: ast.AST, message: str) -> None:
        where = [getattr(node, key, 0) or 0 for key in ("lineno", "col_offset", "end_col_offset")]
        self.problems.append((*where, message))

    # -- imports: every component past the root is checked like an attribute

    def _check_import(self, node: ast.AST, parts: list[str]) -> None:
        dotted = ".".join(parts)
        if parts[0] not in ALLOWED_IMPORTS:
            self.flag(node, f"import of {parts[0]!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")
            return
        for part in parts[1:]:
            problem = _name_problem(part)
            if problem:
                self.flag(node, f"import of {dotted!r}: {problem}")
                return
        if dotted in FORBIDDEN_QUALIFIED:
            self.flag(node, f"import of {dotted!r} is not allowed")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_import(node, alias.name.split("."))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag(node, "relative imports are not allowed")
            return
        for alias in node.names:
            if alias.name == "*":
                self.flag(node, "`import *` is not allowed")
                continue
            self._check_import(node, (node.module or "").split(".") + [alias.name])

    # -- scopes: who may be written to

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, owner: str | None) -> None:
        decorators = getattr(node, "decorator_list", [])
        self.allowed_calls.update(id(d.func) for d in decorators if isinstance(d, ast.Call))
        for outer in [*decorators, node.args, getattr(node, "returns", None)]:
            if outer is not None:
                self.visit(outer)
        body = node.body if isinstance(node.body, list) else [node.body]
        if owner:
            for bound, name in _bindings(body):
                if name == owner:
                    self.flag(bound, f"rebinding {owner!r} inside its method is not allowed")
        self.owners.append((owner, not isinstance(node, ast.Lambda) and _decorated(node, "classmethod")))
        for stmt in body:
            self.visit(stmt)
        self.owners.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_function(node, None)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_function(node, None)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for outer in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(outer)
        self.owners.append((None, False))
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._visit_function(stmt, _owner_param(stmt))
            else:
                self.visit(stmt)
        self.owners.pop()

    # -- names and attributes

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES or (_dunder(node.id) and node.id != "__name__"):
            self.flag(node, f"use of {node.id!r} is not allowed")
        elif node.id == "type" and id(node) not in self.allowed_calls:
            self.flag(node, "`type` is allowed only as type(x)")
        elif node.id == "wraps" and id(node) not in self.allowed_calls:
            self.flag(node, "functools.wraps is allowed only as a decorator")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 1 and not node.keywords:
            self.allowed_calls.add(id(node.func))
        self.generic_visit(node)

    def _qualified(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.modules:
            return ".".join([self.modules[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, name = node.value, node.attr
        owner_name, is_cls = self.owners[-1] if self.owners else (None, False)
        owner = isinstance(base, ast.Name) and base.id == owner_name
        if isinstance(node.ctx, (ast.Store, ast.Del)) and not owner:
            root = base
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            what = ("monkeypatching a module" if isinstance(root, ast.Name) and root.id in self.modules
                    else "only a method's own self/cls/ctx may be set")
            self.flag(node, f"assigning to {ast.unparse(node)} ({what}) is not allowed")
        problem = _name_problem(name, private_ok=owner)
        if problem:
            self.flag(node, problem)
        elif self._qualified(node) in FORBIDDEN_QUALIFIED:
            self.flag(node, f"{self._qualified(node)} is not allowed")
        elif isinstance(base, ast.Name) and name in self.methods and (base.id in self.classes or (owner and is_cls)):
            self.flag(node, f"reading method {base.id}.{name} through a class is not allowed (use an instance)")
        elif name == "wraps" and id(node) not in self.allowed_calls:
            self.flag(node, "functools.wraps is allowed only as a decorator")
        elif name in ("format", "format_map"):
            literal = isinstance(base, ast.Constant) and isinstance(base.value, str)
            fields = _format_fields(base.value) if literal else None
            if fields is None or any("." in f or "[" in f for f in fields):
                self.flag(node, f".{name} is allowed only on a string literal with plain fields ({{}}, {{name}})")
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "type":
            self.flag(node, "attributes of type(...) are not allowed")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        # A format template reaching a private or dunder attribute, whoever formats it (logging, ...).
        if isinstance(node.value, str) and "{" in node.value:
            for field in _format_fields(node.value) or []:
                if any(p.startswith("_") for p in re.split(r"[.\[\]]", field)[1:]):
                    self.flag(node, f"format field {{{field}}} reaches a private or dunder attribute")

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        self.flag(node, "class patterns in `case` read attributes and are not allowed")
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


def _undefined_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Names read but bound nowhere in the module (scope-blind) and not builtins: something else put
    them there (Triton's interpreter copies its own globals, `inspect` among them, into kernel modules)."""
    bound = set(dir(builtins)) | {"__name__", "__file__", "__doc__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return [(n.lineno, f"name {n.id!r} is never defined in the module") for n in ast.walk(tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound]


def static_check(source: str, arg_names: tuple[str, ...]) -> StaticResult:
    """Syntax, `forward` and its signature, forbidden imports, names, attributes and attribute writes."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        return StaticResult(False, f"source is larger than {MAX_SOURCE_BYTES} bytes")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return StaticResult(False, f"line {exc.lineno}: syntax error: {exc.msg}", exc.lineno or 0)
    visitor = _Visitor(tree)
    visitor.visit(tree)
    problems = [(line, message) for line, _, _, message in sorted(visitor.problems)]  # reading order
    problems = sorted(problems + _undefined_names(tree), key=lambda p: p[0])
    forward_problem = _check_forward(tree, arg_names)
    if forward_problem:
        problems.append(forward_problem)
    if not problems:
        return StaticResult(True)
    line, message = problems[0]
    return StaticResult(False, f"line {line}: {message}" if line else message, line)
