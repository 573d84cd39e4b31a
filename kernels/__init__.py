"""kernelloop's op library, kernel registry and dispatch.

Importing this package is cheap (no torch, no Triton): `agent --help` loads without them. Loading the op table (`kernelloop.kernels.ops`, or `OPS`/`get_op` from here) configures
Triton first (interpreter when there is no CUDA device), before any kernel is decorated; see
kernels/device.py.
"""

import sys
from typing import Any

__all__ = ["OPS", "get_op"]


def _yield_the_name() -> None:
    """Imported as top-level `kernels` (the checkout's root on sys.path: pytest, `python -m` there), this
    folder would hide Hugging Face's kernel hub, which transformers imports by that name: hand the name
    to the installed hub when there is one."""
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != root]
    spec = importlib.machinery.PathFinder.find_spec("kernels", elsewhere)
    if spec is None or spec.loader is None:
        return
    hub = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = hub  # what `import kernels` returns once this module's code has run
    spec.loader.exec_module(hub)


if __name__ == "kernels":
    _yield_the_name()


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kernelloop.kernels import ops

        return getattr(ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
