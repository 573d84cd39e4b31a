"""Purity, statically: a candidate holds no state written after import, and reads no clock, no
random generator and nothing of its process that could tell a judge from a server.

A check runs a kernel a few hundred times in fresh processes; a server runs it for days. A module
that counts its calls, remembers inputs, reads a clock or asks how many threads it has can be
correct in the one and wrong in the other, so none of it is allowed:

- import time (the module body, class bodies, decorators, defaults) may build module-level tables;
  call time (the body of a def or lambda) may change only what the call itself created: containers
  it bound to a literal, a comprehension, dict()/list()/set()/bytearray() or *args/**kwargs
  (directly: `d[k] = v`, `d.pop(k)`), and tensors it allocated (any view of them; in-place tensor
  methods such as `t.add_()`, `out=` and torch's `*_` functions count as changes). `self` is written
  only in `__init__`/`__post_init__` (instances never change after construction) and an autograd
  Function's `ctx` only by plain assignment; no `global`/`nonlocal` of a name the function binds, no
  in-place operator functions (operator.setitem, operator.iadd, ...), no `next()` on an iterator the
  call did not make;
- at import: no iterator kept for later (`map`, `zip`, `iter`, itertools, generators, generator
  expressions: consume them, e.g. `tuple(...)`), no torch call but device, dtype and capability
  queries and decorators (a tensor made at import is state every call shares), functools.lru_cache
  and cache only as decorators of a def;
- anywhere: no random generator torch owns (rand*, randn*, randint*, randperm, bernoulli,
  multinomial, normal_, uniform_, Generator, manual_seed, seed, ...; Triton's counter-based tl.rand
  takes its seed from the call and stays allowed), no clock (triton.testing, torch.utils.benchmark,
  the profilers), no caches' or kernels' runtime state (cache_info, cache_clear, best_config, ...),
  no process-wide torch or triton setting (set_*), nothing from ENVIRONMENT below, no hash() or id()
  (both differ from process to process).

The runtime layer (kernels/candidate/loader.py) freezes what can be frozen after import; this module
names the line and says why.
"""

from __future__ import annotations

import ast
import re

from kernelloop.kernels.candidate.impure_names import BACKEND_QUERIES, PROCESS_DEPENDENT, WHY
from kernelloop.kernels.candidate.privilege import Privileges
from kernelloop.kernels.candidate.tree_facts import COMPREHENSIONS, FUNCTIONS, TreeFacts

MUTATORS = frozenset({"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add",
                      "discard", "remove", "sort", "reverse", "difference_update", "intersection_update",
                      "symmetric_difference_update", "send", "throw", "enter_context", "callback", "push",
                      "pop_all"})
ITERATOR_MAKERS = frozenset({"iter", "map", "filter", "zip", "enumerate", "reversed"})
CONSUMERS = frozenset({"list", "tuple", "set", "frozenset", "dict", "sorted", "sum", "min", "max", "any", "all", "len",
                       "next", *ITERATOR_MAKERS})
CONSTRUCTORS = frozenset({"dict", "list", "set", "bytearray"})
TENSOR_FACTORIES = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
                              "full", "full_like", "tensor", "arange"})
TENSOR_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "clone"})
# The torch calls that may run at import: device, dtype and capability queries, and decorators.
IMPORT_TIME_TORCH = frozenset({
    "torch.cuda.is_available", "torch.cuda.get_device_capability", "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties", "torch.cuda.device_count", "torch.cuda.is_bf16_supported",
    "torch.cuda.is_tf32_supported", "torch.cuda.device", "torch.device", "torch.finfo", "torch.iinfo", "torch.Size",
    "torch.no_grad", "torch.inference_mode", "torch.amp.custom_fwd", "torch.amp.custom_bwd",
    "torch.cuda.amp.custom_fwd", "torch.cuda.amp.custom_bwd", "torch.jit.ignore", "torch.jit.unused",
    "torch.compiler.disable", "torch.compiler.allow_in_graph", "torch.autograd.function.once_differentiable",
    "torch.cpu.is_available", "torch.xpu.is_available", "torch.mps.is_available",
})


def _is_jit(fn: ast.AST, facts: TreeFacts, jitted: set[str]) -> bool:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return fn.name in jitted or any("jit" in (facts.qualified(d.func if isinstance(d, ast.Call) else d) or "")
                                    for d in fn.decorator_list)


class _Purity:
    def __init__(self, facts: TreeFacts, privileges: Privileges) -> None:
        self.facts, self.privileges = facts, privileges
        self.problems: list[tuple[int, int, str]] = []
        # Builtins the module leaves alone (a module may bind its own `list` or `next`).
        self.builtins = {n for n in CONSUMERS | CONSTRUCTORS | ITERATOR_MAKERS | PROCESS_DEPENDENT
                         if n not in facts.bound and n not in privileges.by_name}
        self.jitted = {a.id for node in facts.nodes if isinstance(node, ast.Call)
                       and (facts.qualified(node.func) or "").endswith(".jit") for a in node.args if isinstance(a, ast.Name)}
        self._bound_in: dict[int, set[str]] = {}
        self._kinds: dict[tuple[int, str], str | None] = {}
        self.generators = {f.name for f in facts.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and not f.decorator_list and _yields(f, facts)}

    def flag(self, node: ast.AST, message: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), message))

    def run(self) -> list[tuple[int, int, str]]:
        for node in self.facts.nodes:
            fn = self.facts.enclosing_function(node) if isinstance(node, _INTERESTING) else None
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                self._declaration(node)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and fn is not None:
                self._mutation(node, node.value, fn, "changes")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and fn is not None:
                self._attribute_write(node, fn)
            elif isinstance(node, ast.Attribute) and (node.attr in MUTATORS or _IN_PLACE.match(node.attr)):
                qualified = self.facts.qualified(node)
                if qualified is None:
                    self._mutator(node, fn)
                elif node.attr in MUTATORS and not (qualified.split(".")[0] in ("torch", "triton")
                                                    and node.attr in _MODULE_FUNCTIONS):
                    self._mutator(node, fn)
            elif isinstance(node, ast.Call):
                self._call(node, fn)
            elif isinstance(node, ast.GeneratorExp) and fn is None:
                self._kept_iterator(node, "a generator expression")
            elif isinstance(node, (ast.Name, ast.Attribute)) and self.facts.qualified(node) in (
                    "functools.lru_cache", "functools.cache"):
                self._cache_decorator(node)
            elif isinstance(node, ast.Name) and node.id in PROCESS_DEPENDENT and node.id in self.builtins:
                self.flag(node, f"{node.id}() gives a different value in every process ({WHY})")
        return self.problems

    # -- call time: what may be changed

    def _declaration(self, node: ast.Global | ast.Nonlocal) -> None:
        scope = self._scope_of(node)
        if scope is None:
            return  # `global` at module level changes nothing
        bound = self._bound_in.get(id(scope))
        if bound is None:
            nodes = list(ast.walk(scope))
            bound = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
            bound |= {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n is not scope}
            self._bound_in[id(scope)] = bound
        written = [n for n in node.names if n in bound]
        if written:
            keyword = "global" if isinstance(node, ast.Global) else "nonlocal"
            self.flag(node, f"`{keyword} {written[0]}` writes state that outlives the call ({WHY})")

    def _scope_of(self, node: ast.AST) -> ast.AST | None:
        parent = self.facts.parent(node)
        while parent is not None and not isinstance(parent, (*FUNCTIONS, ast.ClassDef)):
            parent = self.facts.parent(parent)
        return parent

    def _attribute_write(self, node: ast.Attribute, fn: ast.AST) -> None:
        owner = self.privileges.owner(fn)
        if owner is None or not (isinstance(node.value, ast.Name) and node.value.id == owner.param):
            return  # writes through anything else are refused by the static check's attribute rule
        top = self.facts.parent(node)
        while isinstance(top, (ast.Tuple, ast.List, ast.Starred)):
            top = self.facts.parent(top)
        plain = isinstance(node.ctx, ast.Store) and isinstance(top, (ast.Assign, ast.AnnAssign))
        what = f"{owner.param}.{node.attr}"
        if owner.kind == "cls":
            self.flag(node, f"writes class state `{what}` after import ({WHY})")
        elif not plain:
            self.flag(node, f"changes `{what}` in place (only `{what} = value` is allowed, in __init__)")
        elif owner.kind == "self" and owner.method not in ("__init__", "__post_init__"):
            self.flag(node, f"writes `{what}` outside __init__ (instances must not change after construction: {WHY})")

    def _mutator(self, node: ast.Attribute, fn: ast.AST | None) -> None:
        if fn is None:
            parent = self.facts.parent(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self.flag(node, f"a bound .{node.attr} kept from import time would change module state when "
                                f"called later ({WHY})")
            return
        if _is_jit(fn, self.facts, self.jitted) and isinstance(node.value, ast.Name) and node.value.id in \
                self.facts.local_bindings(fn):
            return  # a Triton tensor's method (x.sort()); kernels hold no Python containers
        verb = f"calls .{node.attr} on" if node.attr in MUTATORS else f"changes in place (.{node.attr})"
        self._mutation(node, node.value, fn, verb)

    def _mutation(self, node: ast.AST, container: ast.AST, fn: ast.AST, verb: str) -> None:
        root, direct = container, True
        while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
            if isinstance(root, ast.Call) and self._value_kind(root) is not None:
                return  # a new object made right here: torch.empty(n)[0] = 1
            root = root.func if isinstance(root, ast.Call) else root.value
            direct = False
        if isinstance(root, (ast.List, ast.Dict, ast.Set, ast.Constant, *COMPREHENSIONS)) and direct:
            return  # a literal changed right where it is made ([].append(1)); its elements are not new
        shown = _short(container)
        if not isinstance(root, ast.Name):
            self.flag(node, f"{verb} `{shown}`, the result of an expression that may be shared state ({WHY})")
            return
        local = self.facts.local_bindings(fn).get(root.id)
        if local is None:
            if root.id in self.facts.module_names:
                self.flag(node, f"{verb} module-level state `{shown}` after import ({WHY})")
            else:
                self.flag(node, f"{verb} `{shown}`, which outlives the call ({WHY})")
            return
        key = (id(fn), root.id)
        if key not in self._kinds:
            self._kinds[key] = self._fresh_kind(local, fn)
        kind = self._kinds[key]
        if kind == "tensor" or (kind == "container" and direct):
            return
        owner = self.privileges.owner(fn)
        if owner is not None and root.id == owner.param:
            self.flag(node, f"{verb} `{shown}` (instances must not change after construction: {WHY})")
        else:
            self.flag(node, f"{verb} `{shown}`, which may hold state shared between calls (a function may change "
                            f"only containers and tensors it creates itself: {WHY})")

    def _fresh_kind(self, bindings: list[ast.AST], fn: ast.AST) -> str | None:
        """'container' or 'tensor' when every binding of a local makes a new object, else None."""
        kinds = set()
        for node in bindings:
            if isinstance(node, ast.arg):
                args = fn.args
                if node is not args.vararg and node is not args.kwarg:
                    return None
                kinds.add("container")
                continue
            parent = self.facts.parent(node)
            if isinstance(parent, (ast.AugAssign, ast.Delete)):
                continue
            if isinstance(parent, ast.Assign) and any(t is node for t in parent.targets) or \
                    isinstance(parent, (ast.AnnAssign, ast.NamedExpr)) and parent.target is node:
                kind = self._value_kind(parent.value)
            else:
                return None
            if kind is None:
                return None
            kinds.add(kind)
        kinds.discard("constant")
        if not kinds:
            return "container"
        return kinds.pop() if len(kinds) == 1 else None

    def _value_kind(self, value: ast.AST | None) -> str | None:
        if value is None:
            return "constant"
        if isinstance(value, ast.Constant):
            return "constant"
        if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
            return "container"
        if isinstance(value, ast.IfExp):
            a, b = self._value_kind(value.body), self._value_kind(value.orelse)
            return a if a == b or b == "constant" else b if a == "constant" else None
        if isinstance(value, ast.BinOp) and any(isinstance(v, (ast.List, ast.ListComp)) for v in (value.left, value.right)):
            return "container"
        if isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Name) and func.id in CONSTRUCTORS and func.id in self.builtins:
                return "container"
            qualified = self.facts.qualified(func) or ""
            if qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in TENSOR_FACTORIES:
                return "tensor"
            if isinstance(func, ast.Attribute) and not qualified and (
                    func.attr in TENSOR_METHODS or self._value_kind(func.value) == "tensor"):
                return "tensor"  # x.new_empty(n), or a method of a tensor made right here: torch.empty(n).fill_(0)
        return None

    # -- calls: next(), and what may run at import

    def _call(self, node: ast.Call, fn: ast.AST | None) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) and func.id in self.builtins else None
        if fn is not None:
            if name == "next" and node.args:
                self._next(node, node.args[0], fn)
            qualified = self.facts.qualified(func) or ""
            for kw in node.keywords:
                if kw.arg == "out":  # torch.add(a, b, out=t) writes t
                    self._mutation(kw.value, kw.value, fn, "writes into")
            if qualified.startswith("torch.") and _IN_PLACE.match(qualified.rsplit(".", 1)[-1]) and node.args:
                self._mutation(node, node.args[0], fn, f"{qualified} changes")  # torch.Tensor.add_(t, 1)
            return
        qualified = self.facts.qualified(func) or ""
        if name in ITERATOR_MAKERS or qualified.startswith("itertools."):
            self._kept_iterator(node, f"{qualified or name}(...)")
        elif isinstance(func, ast.Name) and func.id in self.generators:
            self._kept_iterator(node, f"the generator {func.id}()")
        elif qualified.startswith("torch.") and qualified not in IMPORT_TIME_TORCH \
                and qualified.rsplit(".", 1)[-1] not in BACKEND_QUERIES:
            self.flag(node, f"{qualified}(...) runs at import: only device, dtype and capability queries and "
                            f"decorators may (a tensor made at import is state every call shares: {WHY})")

    def _next(self, node: ast.Call, iterator: ast.AST, fn: ast.AST) -> None:
        if isinstance(iterator, (ast.Call, ast.GeneratorExp)):
            return
        if isinstance(iterator, ast.Name):
            bindings = self.facts.local_bindings(fn).get(iterator.id) or []
            made = [self.facts.parent(b) for b in bindings]
            if made and all(isinstance(m, (ast.Assign, ast.NamedExpr)) and isinstance(m.value, (ast.Call, ast.GeneratorExp))
                            for m in made):
                return
        self.flag(node, f"next() advances `{_short(iterator)}`, an iterator the call did not make ({WHY})")

    def _kept_iterator(self, node: ast.AST, what: str) -> None:
        child, parent = node, self.facts.parent(node)
        while True:
            if isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is child:
                return
            if isinstance(parent, ast.Starred):
                child, parent = parent, self.facts.parent(parent)
                continue
            if not isinstance(parent, ast.Call) or child is parent.func:
                break
            func = parent.func
            qualified = self.facts.qualified(func) or ""
            if isinstance(func, ast.Name) and func.id in self.builtins and func.id in ITERATOR_MAKERS \
                    or qualified.startswith("itertools."):
                child, parent = parent, self.facts.parent(parent)  # an iterator of iterators: consumed if it is
                continue
            if isinstance(func, ast.Name) and func.id in CONSUMERS and func.id in self.builtins \
                    or qualified in ("math.prod", "math.fsum", "functools.reduce") \
                    or isinstance(func, ast.Attribute) and func.attr == "join" and isinstance(func.value, ast.Constant):
                return
            break
        self.flag(node, f"{what} made at import and kept is state every call shares: consume it at import, "
                        f"e.g. tuple(...) ({WHY})")

    def _cache_decorator(self, node: ast.AST) -> None:
        parent = self.facts.parent(node)
        if isinstance(parent, ast.Attribute):
            return  # the inner part of a longer chain
        used = parent if isinstance(parent, ast.Call) and parent.func is node else node
        holder = self.facts.parent(used)
        if isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(d is used for d in holder.decorator_list):
            allocation = next((n for n in ast.walk(holder) if isinstance(n, ast.Call) and n is not used
                               and self._value_kind(n) == "tensor"), None)
            if allocation is not None:
                self.flag(allocation, f"{holder.name} is cached and allocates a tensor: every call with the same "
                                      f"arguments would get the same tensor ({WHY})")
            return
        self.flag(node, "functools.lru_cache/cache is allowed only as a decorator of a def "
                        "(a cache built around anything else can hand out state)")


_INTERESTING = (ast.Subscript, ast.Attribute, ast.Call, ast.GeneratorExp)
_IN_PLACE = re.compile(r"^[a-z][a-z0-9_]*[a-z0-9]_$")  # torch's in-place convention: add_, copy_, index_put_
# torch and triton functions whose names are also container methods (torch.add, tl.sort).
_MODULE_FUNCTIONS = frozenset({"add", "sort"})


def _yields(fn: ast.AST, facts: TreeFacts) -> bool:
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) and facts.enclosing_function(n) is fn
               for n in ast.walk(fn))


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def purity_problems(facts: TreeFacts, privileges: Privileges) -> list[tuple[int, int, str]]:
    """(line, column, reason) for every impure construct of the module."""
    return _Purity(facts, privileges).run()
