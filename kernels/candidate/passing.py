"""Decorators that cannot forge a method's first parameter: a decorator of the module that returns the
function itself, or wrappers that call it only with their own first parameter first (Liger's
ensure_contiguous: `@functools.wraps(fn) def wrapper(ctx, *args, **kwargs): ... return fn(ctx, ...)`).

A decorator receives the raw function and could call it with anything as `self`; these cannot: the
function is used only as `return fn`, in `functools.wraps(fn)` on a wrapper, or called as
`fn(first, ...)` inside a wrapper whose first parameter `first` is never rebound; the decorator
returns only `fn` or such wrappers and uses them for nothing else.
"""

from __future__ import annotations

import ast

from kernelloop.kernels.candidate.tree_facts import TreeFacts


def passing_decorators(facts: TreeFacts) -> set[str]:
    """Module-level decorators that return the function itself, or wrappers that call it only with
    their own first parameter first (Liger's ensure_contiguous)."""
    found = set()
    for d in facts.tree.body:
        if isinstance(d, ast.FunctionDef) and _passes_through(facts, d):
            found.add(d.name)
    return found


def _passes_through(facts: TreeFacts, d: ast.FunctionDef) -> bool:
    a = d.args
    if d.decorator_list or a.posonlyargs or len(a.args) != 1 or a.vararg or a.kwarg or a.kwonlyargs or a.defaults:
        return False
    if facts.binding_count.get(d.name) != 1:
        return False
    fn = a.args[0].arg
    wrappers = {w.name: w for w in d.body if isinstance(w, ast.FunctionDef)}
    returns = [n for n in ast.walk(d) if isinstance(n, ast.Return) and facts.enclosing_function(n) is d]
    if not returns or any(not (isinstance(r.value, ast.Name) and (r.value.id == fn or r.value.id in wrappers))
                          for r in returns):
        return False
    for node in ast.walk(d):
        if isinstance(node, ast.Name) and node.id == fn:
            if not (isinstance(node.ctx, ast.Load) and _passing_use(facts, node, d, wrappers)):
                return False
        elif isinstance(node, ast.Name) and node.id in wrappers and isinstance(node.ctx, ast.Load):
            if not isinstance(facts.parent(node), ast.Return):
                return False
    return all(_clean_wrapper(facts, w) for w in wrappers.values())


def _passing_use(facts: TreeFacts, node: ast.Name, d: ast.FunctionDef, wrappers: dict[str, ast.FunctionDef]) -> bool:
    parent = facts.parent(node)
    if isinstance(parent, ast.Return) and facts.enclosing_function(parent) is d:
        return True
    if isinstance(parent, ast.Call) and parent.func is node:
        w = facts.enclosing_function(parent)
        first = w.args.posonlyargs + w.args.args if isinstance(w, ast.FunctionDef) else []
        return (w in wrappers.values() and bool(first) and bool(parent.args)
                and isinstance(parent.args[0], ast.Name) and parent.args[0].id == first[0].arg)
    if isinstance(parent, ast.Call) and parent.args == [node] and not parent.keywords and \
            facts.qualified(parent.func) == "functools.wraps":
        holder = facts.parent(parent)
        return holder in wrappers.values() and any(x is parent for x in holder.decorator_list)
    return False


def _clean_wrapper(facts: TreeFacts, w: ast.FunctionDef) -> bool:
    first = w.args.posonlyargs + w.args.args
    if not first or len(w.args.defaults) >= len(first):
        return False
    if len(facts.local_bindings(w).get(first[0].arg, [])) != 1:
        return False  # the first parameter rebound before it is passed on
    return all(isinstance(x, ast.Call) and facts.qualified(x.func) == "functools.wraps" for x in w.decorator_list)
