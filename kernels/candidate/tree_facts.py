"""Facts about a parsed candidate that several static rules need, computed once per module.

`TreeFacts(tree)`: each node's parent, the imported names (local name -> dotted module path), which
code runs at import (the module body, class bodies, decorators and defaults) and which at call time
(inside a def or a lambda), and the names each function binds in its own scope, and every name bound anywhere.
"""

from __future__ import annotations

import ast
from typing import Iterator

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def target_names(target: ast.AST) -> Iterator[ast.Name]:
    """The plain names an assignment target binds (through tuple/list unpacking and starred)."""
    if isinstance(target, ast.Name):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from target_names(element.value if isinstance(element, ast.Starred) else element)


def _bound_here(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    return []


class TreeFacts:
    def __init__(self, tree: ast.Module, max_nodes: int | None = None) -> None:
        """One pass over the tree, without recursion (safe at any depth); with `max_nodes`, it stops
        after that many nodes and sets `truncated` (the facts are then incomplete)."""
        self.tree = tree
        self.nodes: list[ast.AST] = []
        self.parents: dict[int, ast.AST] = {}
        self.depth = 0                      # the deepest level, and the first node found there
        self.deepest: ast.AST = tree
        # Name -> line of its first binding other than a class statement, anywhere (scope-blind).
        self.bound: dict[str, int] = {}
        self.binding_count: dict[str, int] = {}  # every binding, class statements included
        self.module_names: set[str] = set()      # names bound at module level (outside defs and classes)
        self.modules: dict[str, str] = {}        # local name -> the dotted name it was imported as
        self.truncated = False
        stack: list[tuple[ast.AST, int, bool]] = [(tree, 1, True)]
        while stack:
            node, depth, module_level = stack.pop()
            if max_nodes is not None and len(self.nodes) >= max_nodes:
                self.truncated = True
                break
            self.nodes.append(node)
            if depth > self.depth:
                self.depth, self.deepest = depth, node
            names = _bound_here(node)
            for name in names:
                self.bound.setdefault(name, getattr(node, "lineno", 0))
                self.binding_count[name] = self.binding_count.get(name, 0) + 1
            if isinstance(node, ast.ClassDef):
                self.binding_count[node.name] = self.binding_count.get(node.name, 0) + 1
                names = [node.name]
            if module_level and not isinstance(node, ast.arg):
                self.module_names.update(names)
            if isinstance(node, ast.Import):
                for a in node.names:
                    root = a.name.split(".")[0]
                    self.modules[a.asname or root] = a.name if a.asname else root
            elif isinstance(node, ast.ImportFrom):
                self.modules.update((a.asname or a.name, f"{node.module}.{a.name}") for a in node.names)
            inner = module_level and not isinstance(node, (*FUNCTIONS, ast.ClassDef))
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
                stack.append((child, depth + 1, inner))
        self._locals: dict[int, dict[str, list[ast.AST]]] = {}

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def enclosing_function(self, node: ast.AST) -> ast.AST | None:
        """The def or lambda whose body holds `node` (None at import time). A decorator, default or
        annotation belongs to the scope around its def."""
        child, parent = node, self.parent(node)
        while parent is not None:
            if isinstance(parent, FUNCTIONS) and child is not parent.args and child is not getattr(parent, "returns", None) \
                    and not any(child is d for d in getattr(parent, "decorator_list", ())):
                return parent
            child, parent = parent, self.parent(parent)
        return None

    def qualified(self, node: ast.AST) -> str | None:
        """`tl.sum` -> 'triton.language.sum' when the chain's root is an imported name, else None."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.modules:
            return ".".join([self.modules[node.id], *reversed(parts)])
        return None

    def scope_bindings(self, scope: ast.AST) -> Iterator[tuple[ast.AST, str]]:
        """(node, name) for every binding in `scope`'s own namespace: nested defs, lambdas and classes
        bind only their name here, comprehension targets stay in the comprehension (its walrus targets
        do not). Parameters of a def or lambda are included as ast.arg nodes."""
        if isinstance(scope, FUNCTIONS):
            a = scope.args
            for arg in [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                        *([a.kwarg] if a.kwarg else [])]:
                yield arg, arg.arg
            body = scope.body if isinstance(scope.body, list) else [scope.body]
        else:
            body = scope.body
        stack: list[tuple[ast.AST, bool]] = [(stmt, False) for stmt in body]
        while stack:
            node, in_comprehension = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield node, node.name
                outer = [*node.decorator_list]
                if isinstance(node, ast.ClassDef):
                    outer += [*node.bases, *(k.value for k in node.keywords)]
                else:
                    outer += [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
                stack.extend((n, in_comprehension) for n in outer)
                continue
            if isinstance(node, ast.Lambda):
                stack.extend((d, in_comprehension) for d in node.args.defaults)
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                parent = self.parent(node)
                if not in_comprehension or isinstance(parent, ast.NamedExpr):
                    yield node, node.id
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                yield node, node.name
            elif isinstance(node, ast.MatchMapping) and node.rest:
                yield node, node.rest
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    yield node, (alias.asname or alias.name).split(".")[0]
            inner = in_comprehension or isinstance(node, COMPREHENSIONS)
            stack.extend((child, inner) for child in ast.iter_child_nodes(node))

    def local_bindings(self, fn: ast.AST) -> dict[str, list[ast.AST]]:
        """Name -> binding nodes, for the names local to the def or lambda `fn` (global/nonlocal
        declarations excluded)."""
        found = self._locals.get(id(fn))
        if found is None:
            declared = {n for node in ast.walk(fn) if isinstance(node, (ast.Global, ast.Nonlocal))
                        and self.enclosing_function(node) is fn for n in node.names}
            found = {}
            for node, name in self.scope_bindings(fn):
                if name not in declared:
                    found.setdefault(name, []).append(node)
            self._locals[id(fn)] = found
        return found
