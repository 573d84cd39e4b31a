"""Turning verified source text into a callable `forward`.

The bytes that are hashed are the bytes that are executed (no second read of the file), and the
source is registered with linecache so Triton's `inspect.getsource` finds it.
"""

from __future__ import annotations

import linecache
import types
from typing import Callable

from kernelloop.kernels.device import configure_triton
from kernelloop.kernels.errors import RegistryError
from kernelloop.kernels.registry.entry import sha256_text

_loaded: dict[str, Callable] = {}  # sha256 -> forward; Triton kernels compile once per process


def load_forward(source: str, expected_sha256: str, label: str) -> Callable:
    """Execute `source` as a fresh module and return its `forward`; refuse a hash mismatch."""
    actual = sha256_text(source)
    if actual != expected_sha256:
        raise RegistryError(f"{label}: source hash {actual[:12]} does not match the manifest's {expected_sha256[:12]}")
    if actual in _loaded:
        return _loaded[actual]
    configure_triton()  # the source decorates kernels: interpreted or compiled is decided now
    filename = f"<kernelloop-registry {label} {actual[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"kernelloop_registry_{actual[:16]}")
    module.__file__ = filename
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except Exception as exc:
        raise RegistryError(f"{label}: source failed to import ({type(exc).__name__}: {exc})") from None
    forward = getattr(module, "forward", None)
    if not callable(forward):
        raise RegistryError(f"{label}: source defines no callable forward")
    _loaded[actual] = forward
    return forward
