"""Static pre-check of a candidate's source, before any process starts.

A cheap first wall, not the only one: the runtime guards (sandbox/inside/guards.py) hold by themselves.
The text itself first (source_text.py: no invisible or control characters, UTF-8 only), then the
syntax, then the rules: imported names are checked like attributes; attributes are written (and
private ones read) only through a privileged first parameter (privilege.py: self/cls of a method
that can only be bound to its class's instances, or an autograd Function's ctx); the module is pure
(purity.py: no state written after import, no clock, randomness or environment). The first problem
found (lowest line) is reported as `line N: ...`. `static_check` answers for any input: a check that
cannot finish (nesting too deep, memory) is a refusal, never an exception.
"""

from __future__ import annotations

import ast
import builtins
import re
import string
from dataclasses import dataclass
from typing import Any, Iterator

from kernelloop.kernels.candidate.impure_names import reach_problem
from kernelloop.kernels.candidate.privilege import AUTOGRAD_METHODS, Owner, Privileges
from kernelloop.kernels.candidate.purity import purity_problems
from kernelloop.kernels.candidate.source_text import text_problem
from kernelloop.kernels.candidate.tree_facts import TreeFacts

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
    "numpy", "compile", "ops", "hub", "from_file", "frombuffer", "from_numpy",
    "from_dlpack", "storage", "untyped_storage", "set_", "CUDAGraph", "graph", "jiterator",
    "cudart", "Event", "serialization", "driver", "build", "knobs", "compile_module_from_src",
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
# Dunder attributes that are plain data of a module: the version strings (vLLM's version guard).
VERSION_ATTRIBUTES = frozenset({"torch.__version__", "triton.__version__"})
MAX_SOURCE_BYTES = 200_000
MAX_DEPTH = 100  # syntax-tree levels; real kernels stay under 30, the checks recurse per level
MAX_NODES = 100_000  # twice what 200 kB of the densest real code makes (about 4 bytes a node)
__all__ = ["ALLOWED_IMPORTS", "AUTOGRAD_METHODS", "FORBIDDEN_NAMES", "StaticResult", "static_check"]


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


def _format_fields(text: str, depth: int = 0) -> list[str] | None:
    """The field names of a str.format template, nested specs included; None if it is not one."""
    fields: list[str] = []
    try:
        for _, field, spec, _ in string.Formatter().parse(text):
            if field is not None:
                nested = _format_fields(spec or "", depth + 1) if depth < 3 else None
                if nested is None:
                    return None
                fields += [field, *nested]
    except ValueError:
        return None
    return fields


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
    def __init__(self, facts: TreeFacts, privileges: Privileges) -> None:
        self.problems: list[tuple[int, int, int, str]] = []  # line, column, end column, message
        self.facts, self.privileges = facts, privileges
        self.modules = facts.modules  # local name -> the dotted name it was imported as
        # Per enclosing function: its privileged first parameter, if any.
        self.owners: list[Owner | None] = []
        self.functions: list[ast.AST | None] = []
        self.allowed_calls: set[int] = set()  # decorator calls (`@functools.wraps(fn)`)
        self.classes = set(privileges.by_name)
        self.methods = privileges.method_names  # read through a class, their first parameter is anything

    def flag(self, node: ast.AST, message: str) -> None:
        where = [getattr(node, key, 0) or 0 for key in ("lineno", "col_offset", "end_col_offset")]
        self.problems.append((*where, message))

    # -- imports: every component past the root is checked like an attribute

    def _check_import(self, node: ast.AST, parts: list[str]) -> None:
        dotted = ".".join(parts)
        if parts[0] not in ALLOWED_IMPORTS:
            self.flag(node, f"import of {parts[0]!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")
            return
        for i, part in enumerate(parts[1:], 1):
            reached = ".".join(parts[:i + 1])
            problem = None if reached in VERSION_ATTRIBUTES else _name_problem(part)
            problem = problem or reach_problem(part, reached)
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

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, owner: Owner | None) -> None:
        decorators = getattr(node, "decorator_list", [])
        self.allowed_calls.update(id(d.func) for d in decorators if isinstance(d, ast.Call))
        for outer in [*decorators, node.args, getattr(node, "returns", None)]:
            if outer is not None:
                self.visit(outer)
        body = node.body if isinstance(node.body, list) else [node.body]
        if owner:
            for bound, name in _bindings(body):
                if name == owner.param:
                    self.flag(bound, f"rebinding {owner.param!r} inside its method is not allowed")
        self.owners.append(owner)
        self.functions.append(node)
        for stmt in body:
            self.visit(stmt)
        self.owners.pop()
        self.functions.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_function(node, None)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_function(node, None)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for outer in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(outer)
        self.owners.append(None)
        self.functions.append(None)
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._visit_function(stmt, self.privileges.owner(stmt))
            else:
                self.visit(stmt)
        self.owners.pop()
        self.functions.pop()

    def _unprivileged(self, base: ast.AST) -> str:
        """Why `base`, named like the enclosing method's first parameter, is not privileged there."""
        fn = self.functions[-1] if self.functions else None
        why = self.privileges.why_not(fn) if fn is not None else None
        params = fn.args.posonlyargs + fn.args.args if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if why and isinstance(base, ast.Name) and params and params[0].arg == base.id:
            return f" ({base.id} is not privileged: {why})"
        return ""

    # -- names and attributes

    def visit_Name(self, node: ast.Name) -> None:
        parent = self.facts.parent(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if node.id == "__version__" and self.modules.get("__version__") in VERSION_ATTRIBUTES:
            return
        if node.id in FORBIDDEN_NAMES or (_dunder(node.id) and node.id != "__name__"):
            self.flag(node, f"use of {node.id!r} is not allowed")
        elif node.id == "type" and not (called and len(parent.args) == 1 and not parent.keywords
                                        and isinstance(self.facts.parent(parent), ast.Compare)):
            self.flag(node, "`type` is allowed only as type(x) in a comparison (`type(x) is K`)")
        elif node.id == "super" and not self._plain_super(node, parent, called):
            self.flag(node, "`super` is allowed only as super() directly in an instance method")
        elif node.id == "wraps" and id(node) not in self.allowed_calls:
            self.flag(node, "functools.wraps is allowed only as a decorator")

    def _plain_super(self, node: ast.Name, parent: ast.AST | None, called: bool) -> bool:
        if not called or parent.args or parent.keywords or "super" in self.privileges.bound:
            return False
        owner = self.privileges.owner(self.facts.enclosing_function(node))
        return owner is not None and owner.kind == "self"

    def _qualified(self, node: ast.AST) -> str | None:
        return self.facts.qualified(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, name = node.value, node.attr
        owner = self.owners[-1] if self.owners else None
        is_owner = owner is not None and isinstance(base, ast.Name) and base.id == owner.param
        qualified = self._qualified(node)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and not is_owner:
            root = base
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            what = ("monkeypatching a module" if isinstance(root, ast.Name) and root.id in self.modules
                    else "only a method's own self/cls/ctx may be set")
            self.flag(node, f"assigning to {ast.unparse(node)[:80]} ({what}) is not allowed{self._unprivileged(base)}")
        private_ok = is_owner and owner.kind in ("self", "cls") and name in self.privileges.private_names(
            owner.cls, owner.kind)
        outermost = not (isinstance(self.facts.parent(node), ast.Attribute) and self.facts.parent(node).value is node)
        problem = None if qualified in VERSION_ATTRIBUTES else _name_problem(name, private_ok=private_ok)
        if problem and is_owner and name.startswith("_") and not _dunder(name):
            unsafe = self.privileges.unsafe_base(owner.cls)
            problem = (f"private attribute access .{name} is not allowed (ctx is torch's object)" if owner.kind == "ctx"
                       else f"private attribute access .{name} is not allowed (class {owner.cls.name} inherits from "
                            f"{unsafe}, whose private attributes {owner.param} could reach)" if unsafe
                       else f"private attribute access .{name} is not allowed ({owner.param} may read only the "
                            f"private attributes class {owner.cls.name} defines)")
        elif problem and name.startswith("_") and not _dunder(name):
            problem += self._unprivileged(base)
        problem = problem or reach_problem(name, qualified, outermost)
        if problem:
            self.flag(node, problem)
        elif qualified in FORBIDDEN_QUALIFIED:
            self.flag(node, f"{qualified} is not allowed")
        elif isinstance(base, ast.Name) and name in self.methods and (
                base.id in self.classes or (is_owner and owner.kind == "cls")):
            self.flag(node, f"reading method {base.id}.{name} through a class is not allowed (use an instance)")
        elif name == "cache" and qualified != "functools.cache" and not is_owner:
            self.flag(node, ".cache reads the runtime state of a cache or a kernel, which grows with the calls")
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


def _undefined_names(nodes: list[ast.AST]) -> list[tuple[int, str]]:
    """Names read but bound nowhere in the module (scope-blind) and not builtins: something else put
    them there (Triton's interpreter copies its own globals, `inspect` among them, into kernel modules)."""
    bound = set(dir(builtins)) | {"__name__", "__file__", "__doc__"}
    for node in nodes:
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
    return [(n.lineno, f"name {n.id!r} is never defined in the module") for n in nodes
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound]


def static_check(source: Any, arg_names: tuple[str, ...]) -> StaticResult:
    """Syntax, `forward` and its signature, forbidden imports, names, attributes and attribute writes,
    purity, and the text itself. Total: any input gets a StaticResult, never an exception."""
    try:
        return _static_check(source, arg_names)
    except (RecursionError, MemoryError) as exc:
        return StaticResult(False, f"the module is too deeply nested or too large to check ({type(exc).__name__})")
    except Exception as exc:  # noqa: BLE001  (a check that cannot finish refuses; it never stops the judge)
        return StaticResult(False, f"the static check could not analyse this module ({type(exc).__name__})")


def _static_check(source: Any, arg_names: tuple[str, ...]) -> StaticResult:
    if isinstance(source, (bytes, bytearray)):
        source = bytes(source).decode("utf-8", errors="surrogateescape")
    if not isinstance(source, str):
        return StaticResult(False, f"the source must be text, not {type(source).__name__}")
    if len(source.encode("utf-8", errors="surrogatepass")) > MAX_SOURCE_BYTES:
        return StaticResult(False, f"source is larger than {MAX_SOURCE_BYTES} bytes")
    problem = text_problem(source)
    if problem:
        return StaticResult(False, f"line {problem[0]}: {problem[1]}", problem[0])
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return StaticResult(False, f"line {exc.lineno}: syntax error: {exc.msg}", exc.lineno or 0)
    except (RecursionError, MemoryError, ValueError) as exc:
        return StaticResult(False, f"the module does not parse: it is nested too deeply or too large ({type(exc).__name__})")
    facts = TreeFacts(tree, MAX_NODES)
    if facts.depth > MAX_DEPTH:
        line = getattr(facts.deepest, "lineno", 0)
        return StaticResult(False, f"line {line}: code nested more than {MAX_DEPTH} levels deep is not allowed", line)
    if facts.truncated:
        return StaticResult(False, f"the module has more than {MAX_NODES} syntax-tree nodes (a kernel module needs "
                                   "far fewer)")
    privileges = Privileges(facts)
    visitor = _Visitor(facts, privileges)
    visitor.visit(tree)
    problems = [(line, message) for line, _, _, message in sorted(visitor.problems)]  # reading order
    purity = [(line, message) for line, _, message in sorted(purity_problems(facts, privileges) + privileges.problems)]
    problems = sorted(problems + purity + _undefined_names(facts.nodes), key=lambda p: p[0])
    forward_problem = _check_forward(tree, arg_names)
    if forward_problem:
        problems.append(forward_problem)
    if not problems:
        return StaticResult(True)
    line, message = problems[0]
    return StaticResult(False, f"line {line}: {message}" if line else message, line)
