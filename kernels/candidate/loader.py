"""The one way a candidate module is executed: by the sandbox's runner (sandbox/inside/worker.py) and by the
engine's registry loader (kernels/registry/loader.py) alike, so a kernel cannot tell which world it
is in by how it was loaded.

`load_kernel(source, arg_names)`:
1. the canonical text (kernels/candidate/canonical.py) is what is compiled, under the label
   `<kernelloop_kernel HASH>`, and the only text linecache holds for it;
2. the static check (kernels/candidate/static_check.py), unless the caller ran it already (the judge
   runs it before any process starts, and can be told not to, to show the other layers hold);
3. a fresh module named `kernelloop_kernel` (in sys.modules only while it executes, which is what
   @dataclass needs, so several loaded kernels never collide), with the guarded builtins
   (kernels/candidate/guarded_builtins.py: import allowlist, inert logging, tensor-free caches);
4. its state frozen and snapshotted (kernels/candidate/runtime_purity.py): `LoadedKernel.forward`
   raises ImpureModule after any call that changed it (the judge checks more of it than the engine:
   see Snapshot; the module cannot tell which).
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
import threading
import types
from dataclasses import dataclass, field
from operator import is_
from typing import Any, Callable

from kernelloop.kernels.candidate.canonical import Canonical, CanonicalError, canonical
from kernelloop.kernels.candidate.guarded_builtins import candidate_builtins
from kernelloop.kernels.candidate.runtime_purity import CELL_CONTENTS, IMPURE, ImpureModule, Snapshot, freeze

MODULE_NAME = "kernelloop_kernel"
_EXEC_LOCK = threading.Lock()  # sys.modules holds one MODULE_NAME at a time


class LoadError(Exception):
    """The candidate is refused before or while it is executed (one line)."""


@dataclass
class LoadedKernel:
    canonical: Canonical
    namespace: dict[str, Any]
    own_forward: Callable[..., Any]  # the module's forward, unchecked
    snapshot: Snapshot
    forward: Callable[..., Any] = field(init=False)  # the module's forward, purity checked after each call

    def __post_init__(self) -> None:
        self.forward = checked_forward(self.own_forward, self.snapshot)


def checked_forward(forward: Callable[..., Any], snapshot: Snapshot) -> Callable[..., Any]:
    """`forward`, raising ImpureModule after a call that changed the module's state."""
    changed = snapshot.changed
    (view, size, values), *more = snapshot.views
    cells, contents = [c for c, _ in snapshot.cells], snapshot.cell_values
    inline = not more  # the engine's case: the module's dict and its cells are everything checked

    def call(*args: Any) -> Any:
        out = forward(*args)
        if inline and len(view) == size and all(map(is_, view, values)) \
                and (not cells or all(map(is_, map(CELL_CONTENTS, cells), contents))):
            return out
        problem = changed()
        if problem is not None:
            raise ImpureModule(f"{IMPURE}{problem}")
        return out

    return functools.update_wrapper(call, forward)


def load_kernel(source: str, arg_names: tuple[str, ...] | None = None, *, static: bool = True,
                thorough: bool = False) -> LoadedKernel:
    """Execute a candidate's canonical text as a fresh module (see the module docstring). `thorough`:
    the judge's purity check after each call (runtime_purity.Snapshot), rather than the engine's.

    Raises LoadError for a refusal (canonical text, static check, no forward), ImpureModule for
    module-level state that cannot be frozen, and whatever the module itself raised while executing."""
    from kernelloop.kernels.device import configure_triton

    configure_triton()  # the text decorates kernels: interpreted or compiled is decided now
    try:
        canon = canonical(source)
    except CanonicalError as exc:
        raise LoadError(str(exc)) from None
    if static:
        from kernelloop.kernels.candidate.static_check import static_check

        result = static_check(source, arg_names if arg_names is not None else _own_arg_names(canon.tree))
        if not result.ok:
            raise LoadError(f"the static check refuses it: {result.reason}")
    label = canon.label
    linecache.cache[label] = (len(canon.text), None, canon.text.splitlines(keepends=True), label)
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = label
    namespace = module.__dict__
    namespace["__builtins__"] = candidate_builtins()
    code = compile(canon.text, label, "exec", dont_inherit=True)
    with _EXEC_LOCK:
        previous = sys.modules.get(MODULE_NAME)
        sys.modules[MODULE_NAME] = module
        try:
            exec(code, namespace)
        finally:
            if previous is None:
                sys.modules.pop(MODULE_NAME, None)
            else:
                sys.modules[MODULE_NAME] = previous
    forward = namespace.get("forward")
    if not callable(forward):
        raise LoadError("the module defines no callable forward")
    freeze(namespace, MODULE_NAME)
    forward = namespace["forward"]
    return LoadedKernel(canon, namespace, forward, Snapshot(namespace, MODULE_NAME, thorough))


def _own_arg_names(tree: ast.Module) -> tuple[str, ...]:
    """forward's positional parameters, when no op says what they must be (the signature goes unchecked)."""
    for node in reversed(tree.body):
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            return tuple(a.arg for a in node.args.posonlyargs + node.args.args)
    return ()
