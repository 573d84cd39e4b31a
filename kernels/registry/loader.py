"""Turning verified source text into a callable `forward`, exactly as the sandbox's runner loads it.

The bytes that are hashed are the bytes loaded (no second read of the file). Loading is
kernels/candidate/loader.py's, the judge's own: the canonical text under the same module name and
file label, the static check, guarded builtins and the import allowlist, frozen module state; the
`forward` returned raises after a call that changed the module's state (the dispatcher demotes it).
"""

from __future__ import annotations

from typing import Callable

from kernelloop.common.errors import RegistryError
from kernelloop.kernels.candidate.loader import LoadError, load_kernel
from kernelloop.kernels.registry.entry import sha256_text

_loaded: dict[tuple[str, str | None], Callable] = {}  # (sha256, op) -> forward; Triton kernels compile once per process


def load_forward(source: str, expected_sha256: str, label: str, op: str | None = None) -> Callable:
    """Load `source` as a candidate module and return its (purity-checked) `forward`; refuse a hash
    mismatch, a source today's static check refuses, or one that fails to load. `op` names the op
    whose signature forward must have (unchecked without it)."""
    actual = sha256_text(source)
    if actual != expected_sha256:
        raise RegistryError(f"{label}: source hash {actual[:12]} does not match the manifest's {expected_sha256[:12]}")
    if (actual, op) in _loaded:
        return _loaded[(actual, op)]
    try:
        arg_names = None
        if op is not None:
            from kernelloop.kernels.ops import get_op

            arg_names = get_op(op).arg_names
        forward = load_kernel(source, arg_names).forward
    except LoadError as exc:
        raise RegistryError(f"{label}: {exc}") from None
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise RegistryError(f"{label}: source failed to import ({type(exc).__name__}: {message})") from None
    _loaded[(actual, op)] = forward
    return forward
