"""Make Triton's CPU interpreter cheaper per launch, without changing what it computes.

For every launch, and again for every call of one `@triton.jit` function from another, the
interpreter re-patches `triton.language` so its builtins run on numpy: `_patch_builtin` lists each
package's members with `inspect.getmembers` and keeps those marked as builtins. That listing is a
third of a small kernel's interpreted time (cProfile, rmsnorm 3x33: 0.16 s of 0.50 s for 20
launches). The builtins of `triton.language` never change, so they are listed once, before any
launch, with Triton's own wrapper for each (made once by `_patch_attr`), and every later patch sets
the saved wrappers; a package not listed in advance is patched as before. Installed by kernels/interpreter_fidelity.py with its other replacements.
"""

from __future__ import annotations

import inspect
from typing import Any


class _Capture:
    """A stand-in patch scope that keeps the wrapper Triton's `_patch_attr` made, instead of applying it."""

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.value = value


def cached_builtins(interp: Any, tl: Any) -> list[tuple[Any, str, Any]]:
    """The replacement for `interpreter._patch_builtin`, as (owner, attribute, new value)."""
    original, builder = interp._patch_builtin, interp.interpreter_builder
    packages = (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)
    saved: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}
    for pkg in packages:  # listed now, while nothing is patched: the originals are what every launch wraps
        wrappers = []
        for name, member in inspect.getmembers(pkg):
            if tl.core.is_builtin(member):
                capture = _Capture()
                interp._patch_attr(pkg, name, member, builder, capture)  # Triton's own wrapper, made once
                wrappers.append((name, capture.value))
        saved[id(pkg)] = (pkg, wrappers)

    def patch_builtin(pkg: Any, builder_: Any, scope: Any) -> None:
        entry = saved.get(id(pkg))
        if entry is None or entry[0] is not pkg or builder_ is not builder:
            return original(pkg, builder_, scope)
        for name, wrapper in entry[1]:
            scope.set_attr(pkg, name, wrapper)

    return [(interp, "_patch_builtin", patch_builtin)]
