"""The runtime half of purity: a loaded candidate module holds no state that a call can change.

A module that counts its calls, remembers inputs or hands out an old output buffer is right for the
judge's few hundred calls and wrong in a server that runs for days, so after import:

- `freeze(namespace)`: every module-level list, dict, set and bytearray (recursively, also inside
  tuples, in the class attributes and instances of classes the module defines, in its functions'
  defaults and closure cells) becomes its immutable equivalent: tuple, `MappingProxyType` over a
  private copy, frozenset, bytes. A module-level iterator or generator (itertools.count(), iter(),
  a generator: state that advances without a write anyone sees) raises ImpureModule.
- `Snapshot(namespace)`: what the module's state is made of (its dict, its functions' closure cells;
  thoroughly, also its builtins and the dicts of its classes and module-level instances), by
  identity. `changed()` after each call names the first difference: a name rebound, added or
  deleted, a cell rebound. The runner makes it the `impure` verdict; the engine's dispatcher
  demotes the kernel.

Caches handed to candidates (functools.lru_cache/cache/cached_property) refuse results that hold a
tensor: see guarded_builtins.py.
"""

from __future__ import annotations

import enum
import types
from operator import attrgetter, is_
from typing import Any, Iterator

MAX_DEPTH = 32
CELL_CONTENTS = attrgetter("cell_contents")
IMPURE = "[impure] "  # starts an ImpureModule's message: the judge's mark for the `impure` verdict


class ImpureModule(RuntimeError):
    """The candidate module holds, or changed, state beyond its import."""


def _is_iterator(value: Any) -> bool:
    kind = type(value)
    return isinstance(value, (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)) or (
        hasattr(kind, "__next__") and hasattr(kind, "__iter__") and not isinstance(value, type))


class _Freezer:
    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        self.memo: dict[int, Any] = {}  # id(original) -> frozen, so shared objects stay shared
        self.keep: list[Any] = []       # originals stay alive while the memo holds their ids
        self.seen: set[int] = set()     # objects already walked in place

    def value(self, v: Any, where: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ImpureModule(f"{IMPURE}{where}: module-level data nested more than {MAX_DEPTH} deep")
        if id(v) in self.memo:
            return self.memo[id(v)]
        kind = type(v)
        if kind in (list, tuple):
            frozen: Any = tuple(self.value(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
            if kind is tuple and all(a is b for a, b in zip(frozen, v)):
                frozen = v
        elif kind in (dict, types.MappingProxyType):
            copy = {k: self.value(x, f"{where}[{k!r}]", depth + 1) for k, x in v.items()}
            frozen = types.MappingProxyType(copy)
        elif kind in (set, frozenset):
            frozen = frozenset(self.value(x, where, depth + 1) for x in v)
        elif kind is bytearray:
            frozen = bytes(v)
        elif isinstance(v, (list, dict, set, bytearray)):  # a subclass: mutable, no faithful frozen twin
            raise ImpureModule(f"{IMPURE}{where}: a module-level {kind.__name__} (a mutable container) cannot be frozen")
        elif _is_iterator(v):
            raise ImpureModule(f"{IMPURE}{where}: a module-level {kind.__name__} is state that advances with each use "
                               "(kernels must be pure: make it inside the call)")
        else:
            self.walk(v, where, depth)
            frozen = v
        self.memo[id(v)] = frozen
        self.keep.append(v)
        return frozen

    def walk(self, v: Any, where: str, depth: int) -> None:
        """Freeze in place what the module owns inside `v`: its classes, instances and functions."""
        if id(v) in self.seen:
            return
        self.seen.add(id(v))
        if isinstance(v, types.FunctionType) and v.__module__ == self.module_name:
            if v.__defaults__:
                v.__defaults__ = self.value(v.__defaults__, f"{where} defaults", depth + 1)
            if v.__kwdefaults__:
                v.__kwdefaults__ = dict(self.value(v.__kwdefaults__, f"{where} defaults", depth + 1))
            for name, cell in zip(v.__code__.co_freevars, v.__closure__ or ()):
                try:
                    contents = cell.cell_contents
                except ValueError:  # not yet bound
                    continue
                cell.cell_contents = self.value(contents, f"{where} closure {name}", depth + 1)
        elif isinstance(v, (staticmethod, classmethod)):
            self.walk(v.__func__, where, depth + 1)
        elif isinstance(v, type) and v.__module__ == self.module_name and not isinstance(v, enum.EnumMeta):
            for name, attr in list(vars(v).items()):
                if not (name.startswith("__") and name.endswith("__")):
                    frozen = self.value(attr, f"{where}.{name}", depth + 1)
                    if frozen is not attr:
                        type.__setattr__(v, name, frozen)
        elif type(v).__module__ == self.module_name and isinstance(getattr(v, "__dict__", None), dict):
            state = vars(v)
            for name, attr in list(state.items()):
                state[name] = self.value(attr, f"{where}.{name}", depth + 1)


def frozen(value: Any, where: str, module_name: str) -> Any:
    """`value` with its containers made immutable (what a cache handed to a candidate keeps)."""
    return _Freezer(module_name).value(value, where)


def freeze(namespace: dict[str, Any], module_name: str) -> None:
    """Freeze a freshly executed module's state in place (see the module docstring)."""
    freezer = _Freezer(module_name)
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        frozen = freezer.value(value, name)
        if frozen is not value:
            namespace[name] = frozen


class Snapshot:
    """The identity of everything a module's state is made of, taken after `freeze`.

    `thorough` (the judge's runner): also its builtins and the dicts of its classes and module-level
    objects. The engine checks its dict and closure cells only, each call costing well under a
    microsecond: a module whose state changes with its calls does so while judged, where the
    thorough check refuses it, and it cannot tell the two worlds apart."""

    def __init__(self, namespace: dict[str, Any], module_name: str, thorough: bool = True) -> None:
        self.namespace = namespace
        self.dicts: list[tuple[Any, str]] = [(namespace, "the module")]
        if thorough and type(namespace.get("__builtins__")) is dict:
            self.dicts.append((namespace["__builtins__"], "its builtins"))
        self.cells: list[tuple[types.CellType, str]] = []
        seen: set[int] = set()
        for name, value in namespace.items():
            if not (name.startswith("__") and name.endswith("__")):
                self._collect(value, name, module_name, seen, thorough)
        # Checked after every call, by identity (`is`: nothing the module defines, such as an __eq__, takes
        # part): each dict's values in order and its size (a name added, deleted or renamed moves or adds
        # a value), and each closure cell's contents.
        self.views = [(d.values(), len(d), list(d.values())) for d, _ in self.dicts]
        self._cells = [c for c, _ in self.cells]
        self.cell_values = [c.cell_contents for c in self._cells]
        self.held = [list(d.values()) for d, _ in self.dicts] + [self.cell_values]

    def _collect(self, value: Any, where: str, module_name: str, seen: set[int], thorough: bool) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, types.FunctionType) and value.__module__ == module_name:
            for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
                try:
                    cell.cell_contents  # noqa: B018
                except ValueError:
                    continue
                self.cells.append((cell, f"{where}'s closure variable {name}"))
        elif isinstance(value, type) and value.__module__ == module_name:
            if thorough:
                self.dicts.append((vars(value), f"class {value.__name__}"))
            for name, attr in vars(value).items():
                if not (name.startswith("__") and name.endswith("__")):
                    self._collect(attr, f"{value.__name__}.{name}", module_name, seen, thorough)
        elif type(value).__module__ == module_name and isinstance(getattr(value, "__dict__", None), dict):
            if thorough:
                self.dicts.append((vars(value), f"object {where}"))
        elif type(value) is tuple:
            for item in value:
                self._collect(item, where, module_name, seen, thorough)

    def changed(self) -> str | None:
        """None when every name and cell still holds the object it held; else what changed."""
        for view, size, values in self.views:
            if len(view) != size or not all(map(is_, view, values)):
                break
        else:
            if not self._cells or all(map(is_, map(CELL_CONTENTS, self._cells), self.cell_values)):
                return None
        for (d, what), before in zip(self.dicts, self.held):
            difference = _difference(d, before)
            if difference:
                return f"{what} changed after import: {difference} (kernels must be pure)"
        for (cell, what), value in zip(self.cells, self.held[-1]):
            if cell.cell_contents is not value:
                return f"{what} was rebound after import (kernels must be pure)"
        return "its state changed after import (kernels must be pure)"


def _difference(d: dict[str, Any], before_values: list[Any]) -> str | None:
    now = list(d.items())
    if len(now) == len(before_values) and all(v is b for (_, v), b in zip(now, before_values)):
        return None
    for i, (key, value) in enumerate(now):
        if i >= len(before_values):
            return f"{str(key)[:60]!r} added"
        if value is not before_values[i]:
            return f"{str(key)[:60]!r} rebound, added or deleted"
    return "a name deleted"


def walk_values(value: Any, module_name: str, depth: int = 0) -> Iterator[Any]:
    """`value` and what it holds (containers, objects of the module's own classes), a few levels deep."""
    yield value
    if depth >= 4:
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        items: Any = value
    elif isinstance(value, (dict, types.MappingProxyType)):
        items = [*value.keys(), *value.values()]
    elif type(value).__module__ == module_name and isinstance(getattr(value, "__dict__", None), dict):
        items = vars(value).values()
    else:
        return
    for item in list(items)[:1024]:
        yield from walk_values(item, module_name, depth + 1)
