"""Which first parameters are privileged: may read private attributes (self/cls) or be written to.

A method's `self` is an instance of its class only if nothing else can ever be passed in its place.
Reading a method through its class (`K.f(torch)`) passes anything, and so does every other way to
reach the class object (`J = K`, `(K,)[0]`, a default argument, a return value, a decorator that
receives the class, a subclass reached so) or the raw function (a decorator that calls it, `g = f`
or `f = staticmethod(f)` in the class body). So privilege is decided by a sound rule, not by
listing tricks:

- a class keeps privilege only if its name is used just to call it (an autograd Function: never;
  it is used through `.apply`), as a direct base of another class (which then keeps it only by the
  same rule: a subclass handed out hands out its bases' methods), in isinstance/issubclass, in a
  comparison, in `except`/`raise`, in an annotation that is never evaluated, or to read an
  attribute that is not one of its methods; it sits at module level or in a function (not in
  another class's body), has no class keywords (metaclass=...) and no decorator but dataclass,
  functools.total_ordering or enum.unique;
- a def keeps it only if it sits directly in such a class's body, has a first parameter without a
  default, no decorator but those that only bind or pass the function's arguments through
  (staticmethod, classmethod, property, functools.lru_cache/cache, torch.no_grad()/inference_mode(),
  or a decorator of the module that calls the function only with its wrapper's own first parameter
  first), and its name is never read in the class body.

self (instance methods, properties) and cls (classmethods, __new__, __init_subclass__,
__class_getitem__) may read the private attributes the module's class itself defines (in its body,
as `self._x = ...` in __init__, or in a module class it inherits from), nothing else private; ctx
(an autograd Function's static forward/backward/setup_context/jvp/vjp, first parameter named ctx) may
be written to, never read privately. Lambdas and nested defs are never privileged.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kernelloop.kernels.candidate.passing import passing_decorators
from kernelloop.kernels.candidate.tree_facts import FUNCTIONS, TreeFacts

AUTOGRAD_METHODS = frozenset({"forward", "backward", "setup_context", "jvp", "vjp"})
AUTOGRAD_BASES = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
CLASS_DECORATORS = frozenset({"dataclass", "dataclasses.dataclass", "functools.total_ordering", "enum.unique"})
BINDING_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
PASSING_DECORATORS = frozenset({"functools.lru_cache", "functools.cache", "torch.no_grad", "torch.inference_mode"})
IMPLICIT_CLASSMETHODS = frozenset({"__new__", "__init_subclass__", "__class_getitem__"})
# External bases whose own private attributes a module class's self can never reach by mistake: object,
# enums (Enum comes last in an enum's bases, so the module's names come first) and autograd Functions.
SAFE_BASES = frozenset({"object", "enum.Enum", "enum.IntEnum", "enum.Flag", "enum.IntFlag", *AUTOGRAD_BASES})
# Protocol methods Python calls with a class object: which parameter holds it.
CLASS_PARAMETERS = {"__exit__": 1, "__aexit__": 1, "__get__": 2, "__set_name__": 1}
# Protocol methods that receive classes to do as they like with (metaclasses, ABC hooks, base rewriting)
# or run at a time nobody chose (finalizers).
REFUSED_METHODS = frozenset({"__mro_entries__", "__subclasshook__", "__instancecheck__", "__subclasscheck__",
                             "__prepare__", "__del__"})


@dataclass(frozen=True)
class Owner:
    """The privileged first parameter of a method."""

    param: str
    kind: str          # "self" | "cls" | "ctx"
    method: str
    cls: ast.ClassDef


class Privileges:
    def __init__(self, facts: TreeFacts) -> None:
        self.facts = facts
        tree = facts.tree
        self.future_annotations = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                                      any(a.name == "annotations" for a in n.names) for n in tree.body)
        self.classes = [n for n in facts.nodes if isinstance(n, ast.ClassDef)]
        self.by_name: dict[str, list[ast.ClassDef]] = {}
        for c in self.classes:
            self.by_name.setdefault(c.name, []).append(c)
        self.bound = facts.bound
        self.autograd = self._autograd_classes()
        # Names of defs whose first parameter a class body would make privileged (not classmethods).
        self.method_names = {f.name for c in self.classes for f in _body_defs(c)
                             if self._kind(c, f, strict=False) in ("self", "ctx")}
        self.revoked: dict[int, str] = {}
        self._methods: dict[str, set[str]] = {}
        self._revoke_classes()
        self.passing = passing_decorators(facts)
        self._class_reads: dict[int, dict[str, int]] = {}
        self.owners: dict[int, Owner] = {}
        self.denied: dict[int, str] = {}
        for c in self.classes:
            for f in _body_defs(c):
                self._decide(c, f)
        self._private: dict[tuple[int, str], set[str]] = {}
        self.problems: list[tuple[int, int, str]] = []  # line, column, message
        self._protocol_problems()

    # -- the class: used only in ways that cannot hand it out

    def _autograd_classes(self) -> set[str]:
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for c in self.classes:
                if c.name not in names and any(self.facts.qualified(b) in AUTOGRAD_BASES or
                                               isinstance(b, ast.Name) and b.id in names for b in c.bases):
                    names.add(c.name)
                    changed = True
        return names

    def _use_problem(self, node: ast.Name) -> str | None:
        """Why this read of a class name could hand the class out, or None."""
        facts, name = self.facts, node.id
        parent = facts.parent(node)
        if self._in_annotation(node):
            return None
        autograd = name in self.autograd
        called = isinstance(parent, ast.Call) and parent.func is node or \
            isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
            any(d is node for d in parent.decorator_list)
        if called:
            return "called (an autograd Function is used through .apply)" if autograd else None
        if isinstance(parent, ast.ClassDef) and any(b is node for b in parent.bases):
            return None
        if isinstance(parent, ast.Attribute) and parent.value is node:
            methods = self._methods_of(name)
            if parent.attr in methods:
                return f"its method {name}.{parent.attr} read through the class"
            return None
        if isinstance(parent, ast.Compare):
            return None
        holder, inner = (facts.parent(parent), parent) if isinstance(parent, ast.Tuple) else (parent, node)
        if isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name) and \
                holder.func.id in ("isinstance", "issubclass") and holder.func.id not in self.bound and \
                any(a is inner for a in holder.args):
            return None
        if isinstance(holder, ast.ExceptHandler) and holder.type is inner or \
                isinstance(parent, ast.Raise) and node in (parent.exc, parent.cause):
            return None
        return f"{_VALUE_USES.get(type(parent), 'used as a value')}"

    def _in_annotation(self, node: ast.AST) -> bool:
        child, parent = node, self.facts.parent(node)
        while parent is not None and not isinstance(parent, ast.stmt):
            if isinstance(parent, ast.arg) and parent.annotation is child:
                return True
            child, parent = parent, self.facts.parent(parent)
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.returns is child:
            return True
        if isinstance(parent, ast.AnnAssign) and parent.annotation is child:
            # in a class body the annotation is kept where dataclasses.fields() hands it out
            return self.future_annotations or not isinstance(self.facts.parent(parent), ast.ClassDef)
        return False

    def _methods_of(self, name: str) -> set[str]:
        """Method names of the classes called `name` and of the module classes they inherit from."""
        if name in self._methods:
            return self._methods[name]
        self._methods[name] = found = set()
        todo, seen = [name], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for c in self.by_name.get(current, []):
                found |= {f.name for f in _body_defs(c) if self._kind(c, f, strict=False) in ("self", "ctx")}
                todo += [b.id for b in c.bases if isinstance(b, ast.Name)]
        return found

    def _revoke_classes(self) -> None:
        reasons: dict[str, str] = {}
        for name, line in self.bound.items():
            if name in self.by_name:
                reasons.setdefault(name, f"the name `{name}` is also bound at line {line}")
        for node in self.facts.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.by_name:
                problem = self._use_problem(node)
                if problem:
                    reasons.setdefault(node.id, f"`{node.id}` is {problem} at line {node.lineno}")
        for c in self.classes:
            own = None
            if c.keywords:
                own = f"class {c.name} has class keywords"
            elif any(self.facts.qualified(d.func if isinstance(d, ast.Call) else d) not in CLASS_DECORATORS
                     for d in c.decorator_list):
                own = f"class {c.name} has a decorator that receives the class"
            elif self._scope(c) is not None and isinstance(self._scope(c), ast.ClassDef):
                own = f"class {c.name} is defined inside another class"
            if own:
                reasons.setdefault(c.name, own)
        # A class handed out hands out the methods it inherits: revoke its module bases too.
        todo = list(reasons)
        while todo:
            name = todo.pop()
            for c in self.by_name.get(name, []):
                self.revoked.setdefault(id(c), reasons[name])
                for b in c.bases:
                    if isinstance(b, ast.Name) and b.id in self.by_name and b.id not in reasons:
                        reasons[b.id] = f"{reasons[name]} (through its subclass {c.name})"
                        todo.append(b.id)

    def _scope(self, node: ast.AST) -> ast.AST | None:
        parent = self.facts.parent(node)
        while parent is not None and not isinstance(parent, (*FUNCTIONS, ast.ClassDef)):
            parent = self.facts.parent(parent)
        return parent

    # -- the def: bound only by the class machinery

    def _kind(self, c: ast.ClassDef, f: ast.FunctionDef | ast.AsyncFunctionDef, strict: bool = True) -> str | None:
        params = f.args.posonlyargs + f.args.args
        if not params:
            return None
        names = {self._decorator_name(d) for d in f.decorator_list}
        if "staticmethod" in names:
            ok = c.name in self.autograd if strict else True
            return "ctx" if ok and f.name in AUTOGRAD_METHODS and params[0].arg == "ctx" else None
        if "classmethod" in names or f.name in IMPLICIT_CLASSMETHODS:
            return "cls"
        return "self"

    def _decorator_name(self, d: ast.AST) -> str:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id in BINDING_DECORATORS and target.id not in self.bound:
            return target.id
        return self.facts.qualified(target) or (target.id if isinstance(target, ast.Name) else ast.unparse(target))

    def _decide(self, c: ast.ClassDef, f: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        kind = self._kind(c, f)
        if kind is None:
            return
        why = self.revoked.get(id(c))
        params = f.args.posonlyargs + f.args.args
        if why is None and len(f.args.defaults) >= len(params):
            why = f"the first parameter of {f.name} has a default"
        for d in f.decorator_list:
            name = self._decorator_name(d)
            if why is None and name not in BINDING_DECORATORS | PASSING_DECORATORS and name not in self.passing:
                why = f"{f.name} is decorated by `{name}`, which receives the raw function"
        if why is None:
            read = self._read_in_class_body(c, f.name)
            if read:
                why = f"the function {f.name} is read in the class body at line {read}"
        if why:
            self.denied[id(f)] = why
        else:
            self.owners[id(f)] = Owner(params[0].arg, kind, f.name, c)

    def _read_in_class_body(self, c: ast.ClassDef, name: str) -> int:
        """The line where the class body (not its functions) reads `name`, 0 if it never does."""
        reads = self._class_reads.get(id(c))
        if reads is None:
            self._class_reads[id(c)] = reads = self._class_body_reads(c)
        return reads.get(name, 0)

    def _class_body_reads(self, c: ast.ClassDef) -> dict[str, int]:
        reads: dict[str, int] = {}
        stack: list[ast.AST] = list(c.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                reads.setdefault(node.id, node.lineno)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack += [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
            elif isinstance(node, ast.Lambda):
                stack += node.args.defaults
            elif isinstance(node, ast.ClassDef):
                stack += [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
            else:
                stack += ast.iter_child_nodes(node)
        return reads

    # -- queries

    def owner(self, fn: ast.AST) -> Owner | None:
        return self.owners.get(id(fn))

    def why_not(self, fn: ast.AST) -> str | None:
        """Why a def in a class body has no privileged first parameter (None if it has one, or is no method)."""
        return self.denied.get(id(fn))

    def private_names(self, c: ast.ClassDef, kind: str = "self") -> set[str]:
        """Private (not dunder) attribute names the module's class `c` and its module bases define: in
        their bodies, and for self also as `self._x = ...` in __init__/__post_init__. None at all when
        an external base other than SAFE_BASES could come first in the lookup."""
        key = (id(c), kind)
        found = self._private.get(key)
        if found is not None:
            return found
        self._private[key] = found = set()
        if self.unsafe_base(c):
            return found
        for stmt in c.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(stmt.name)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
                stmt, (ast.AnnAssign, ast.AugAssign)) else []
            found |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
            if kind == "self" and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    stmt.name in ("__init__", "__post_init__"):
                owner = self.owner(stmt)
                if owner is not None:
                    found |= {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute)
                              and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                              and n.value.id == owner.param}
        for b in c.bases:
            if isinstance(b, ast.Name):
                for base in self.by_name.get(b.id, []):
                    found |= self.private_names(base, kind)
        found -= {n for n in found if not n.startswith("_") or (n.startswith("__") and n.endswith("__"))}
        return found

    def unsafe_base(self, c: ast.ClassDef) -> str | None:
        """The first base outside this module and SAFE_BASES among `c`'s and its module bases' bases."""
        todo, seen = [c], set()
        while todo:
            current = todo.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for b in current.bases:
                if isinstance(b, ast.Name) and b.id in self.by_name:
                    todo += self.by_name[b.id]
                    continue
                name = self.facts.qualified(b) or (b.id if isinstance(b, ast.Name) else ast.unparse(b)[:60])
                if name not in SAFE_BASES:
                    return name
        return None

    # -- protocol methods that hand classes out

    def _protocol_problems(self) -> None:
        for c in self.classes:
            for f in _body_defs(c):
                if f.name in REFUSED_METHODS:
                    self.problems.append((f.lineno, f.col_offset, f"defining {f.name} is not allowed (it is handed "
                                                                  "classes, or runs when the collector decides)"))
                index = CLASS_PARAMETERS.get(f.name)
                params = f.args.posonlyargs + f.args.args
                if index is None or len(params) <= index:
                    continue
                name = params[index].arg
                for node in ast.walk(f):
                    if isinstance(node, ast.Name) and node.id == name and not self._compared(node):
                        self.problems.append((node.lineno, node.col_offset,
                                              f"`{name}` holds a class ({f.name} is given one, maybe this module's): "
                                              "use it only in comparisons and isinstance/issubclass"))

    def _compared(self, node: ast.Name) -> bool:
        parent = self.facts.parent(node)
        if isinstance(parent, ast.Compare):
            return True
        return isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.args[:1] == [node] \
            and parent.func.id in ("isinstance", "issubclass") and parent.func.id not in self.bound


_VALUE_USES = {ast.Assign: "assigned", ast.AnnAssign: "assigned or kept in a class-level annotation",
               ast.NamedExpr: "assigned", ast.arguments: "a default argument", ast.Return: "returned",
               ast.Tuple: "put in a container", ast.List: "put in a container", ast.Set: "put in a container",
               ast.Dict: "put in a container", ast.Call: "passed to a call", ast.keyword: "passed to a call",
               ast.Subscript: "subscripted", ast.Starred: "unpacked"}


def _body_defs(c: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [f for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
