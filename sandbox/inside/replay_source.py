"""What the replayer and the compile process execute of a candidate: the part of its canonical text
(kernels/candidate/canonical.py) that makes its kernels, and nothing that runs launcher code.

`kernel_part(tree)` keeps, from the module level of the canonical AST, with their line numbers:
- imports of triton and math (and `from __future__`);
- the kernels: defs decorated with a jit (`@triton.jit`, `@jit`, `@triton.autotune(...)` over one),
  and defs jitted by assignment (`f = triton.jit(f)`, `k = triton.jit(_impl)`,
  `k = triton.autotune(...)(triton.jit(f))`), all undecorated: a launch is recorded against the
  function's own name and replayed with the arguments the decorators resolved; an assignment that
  names a kernel otherwise (`k = triton.jit(_impl)`) stays as `k = _impl`, for kernels calling `k`;
- the module-level `if` and `try` blocks around any of those, so the branch that ran in the runner
  is the one taken here: an `if` test may only be constants, the module's plain constants (the
  values the runner had), attributes of its triton/math imports (`triton.__version__`),
  comparisons and arithmetic; a `try` around kernels or their imports may hold nothing else in its
  body, and catch only import and attribute errors.
Everything else (assignments, launchers, classes, other defs) is dropped; an `if` or `try` holding
only such code is dropped whole. A structure it cannot keep faithfully raises StructureError.
"""

from __future__ import annotations

import ast
import copy

HANDLED = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError"})  # what a kept `try` may catch
_CONDITION_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Attribute, ast.Compare, ast.BoolOp, ast.UnaryOp,
                    ast.BinOp, ast.Tuple, ast.Subscript, ast.Slice, ast.Load, ast.boolop, ast.cmpop, ast.unaryop,
                    ast.operator)


class StructureError(ValueError):
    """Kernels sit in module-level code the replay cannot redo faithfully."""


def is_jit(node: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def kernel_modules_of(node: ast.Import | ast.ImportFrom, modules: tuple[str, ...]) -> ast.stmt | None:
    """The import restricted to kernel modules (None when none is)."""
    if isinstance(node, ast.ImportFrom):
        return node if not node.level and (node.module or "").split(".")[0] in modules else None
    names = [a for a in node.names if a.name.split(".")[0] in modules]
    if not names:
        return None
    return node if len(names) == len(node.names) else ast.copy_location(ast.Import(names=names), node)


def _jit_targets(body: list[ast.stmt]) -> set[str]:
    """Names passed to a jit call in module-level code (not inside defs or classes)."""
    found: set[str] = set()
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and "jit" in ast.unparse(node.func) and node.args \
                and isinstance(node.args[0], ast.Name):
            found.add(node.args[0].id)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _jitted_def(value: ast.expr, kernels: set[str]) -> str | None:
    """The kernel def an assigned value wraps (`triton.heuristics(...)(triton.jit(f))` -> f), if any."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                and node.args[0].id in kernels:
            return node.args[0].id
    return None


def kernel_part(tree: ast.Module, modules: tuple[str, ...], constants: set[str]) -> tuple[ast.Module, list[ast.FunctionDef]]:
    """The module to execute (see the module docstring) and every kernel def in it."""
    jitted = _jit_targets(tree.body)
    defs_jitted = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and is_jit(n)}
    kernels: list[ast.FunctionDef] = []
    bound = set(constants) | {"True", "False", "None"}
    for node in ast.walk(tree):  # names the kept imports can bind, for the conditions
        if isinstance(node, (ast.Import, ast.ImportFrom)) and kernel_modules_of(node, modules) is not None:
            bound |= {(a.asname or a.name).split(".")[0] for a in kernel_modules_of(node, modules).names}

    def reduce(body: list[ast.stmt], dropped: list[ast.stmt] | None = None) -> list[ast.stmt]:
        kept = []
        for node in body:
            out = one(node)
            if out is not None:
                kept.append(out)
            elif dropped is not None and not isinstance(node, ast.Pass):
                dropped.append(node)
        return kept

    def one(node: ast.stmt) -> ast.stmt | None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return kernel_modules_of(node, modules)
        if isinstance(node, ast.Assign):  # `k = triton.jit(_impl)`: k names the kernel built from _impl
            target, source = node.targets[0], _jitted_def(node.value, jitted | defs_jitted)
            if len(node.targets) == 1 and isinstance(target, ast.Name) and source not in (None, target.id):
                return ast.copy_location(ast.Assign(targets=[ast.Name(target.id, ast.Store())],
                                                    value=ast.Name(source, ast.Load())), node)
            return None
        if isinstance(node, ast.FunctionDef) and (is_jit(node) or node.name in jitted):
            defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            if any(not isinstance(d, ast.Constant) for d in defaults):
                raise StructureError(f"kernel {node.name}: default values must be constants")
            kernel = copy.copy(node)
            kernel.decorator_list = []
            kernels.append(kernel)
            return kernel
        if isinstance(node, ast.If):
            body, orelse = reduce(node.body), reduce(node.orelse)
            if not body and not orelse:
                return None
            check_condition(node.test, bound)
            return ast.copy_location(ast.If(test=node.test, body=body or [_pass(node)], orelse=orelse), node)
        if isinstance(node, ast.Try):
            dropped: list[ast.stmt] = []
            body = reduce(node.body, dropped)
            handlers = [ast.copy_location(ast.ExceptHandler(type=h.type, name=None, body=reduce(h.body) or [_pass(h)]), h)
                        for h in node.handlers]
            orelse, final = reduce(node.orelse), reduce(node.finalbody)
            if not body and not orelse and not final and all(isinstance(h.body[0], ast.Pass) for h in handlers):
                return None
            if dropped:  # code there could raise in the runner and pick the handler: not redone here
                raise StructureError(f"line {dropped[0].lineno}: a module-level try around kernels or their imports "
                                     "may hold only triton/math imports and kernels in its body")
            for h in node.handlers:
                caught = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
                if h.type is None or any(not isinstance(c, ast.Name) or c.id not in HANDLED for c in caught):
                    raise StructureError(f"line {h.lineno}: a module-level try around kernels may catch only "
                                         f"{', '.join(sorted(HANDLED))}")
            return ast.copy_location(ast.Try(body=body or [_pass(node)], handlers=handlers, orelse=orelse,
                                             finalbody=final), node)
        return None

    module = ast.Module(body=reduce(tree.body), type_ignores=[])
    return ast.fix_missing_locations(module), kernels


def _pass(node: ast.AST) -> ast.Pass:
    return ast.copy_location(ast.Pass(), node)


def check_condition(test: ast.expr, names: set[str]) -> None:
    """An `if` test around kernels evaluates the same in the runner and here: see the module docstring."""
    for node in ast.walk(test):
        line = f"line {getattr(node, 'lineno', test.lineno)}"
        if not isinstance(node, _CONDITION_NODES):
            raise StructureError(f"{line}: a module-level `if` around kernels may test only constants, triton/math "
                                 f"attributes and comparisons, not {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in names:
            raise StructureError(f"{line}: a module-level `if` around kernels tests {node.id!r}, which is not a "
                                 "plain constant or a triton/math import")
        if isinstance(node, ast.Attribute):
            root = node
            while isinstance(root, ast.Attribute):
                if root.attr.startswith("_") and root.attr != "__version__":
                    raise StructureError(f"{line}: a module-level `if` around kernels reads .{root.attr}")
                root = root.value
            if not isinstance(root, ast.Name):
                raise StructureError(f"{line}: a module-level `if` around kernels reads an attribute of an expression")
