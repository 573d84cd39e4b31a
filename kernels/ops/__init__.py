"""The op table, discovered: every module of this package, and of each package named in
$KERNELLOOP_OP_PACKAGES, that exports `SPEC: OpSpec` is an op.

An op is two files in one package (docs/ARCHITECTURE.md, "Adding an op"):

- ``<op>.py``: the spec (reference, inputs, shapes, cost, tolerances); its `forward` is imported from
- ``<op>_kernel.py``: the baseline Triton kernel, a self-contained candidate module (only torch,
  triton and math imports): the same text is the baseline, the LLM's example, a search template's
  starting point and what `agent ops --template OP` prints.

An op package may also hold a ``templates`` module (or package) with the op's search templates
(agent/proposers/templates/); discovery here skips it. $KERNELLOOP_OP_PACKAGES names importable
packages (or single modules) separated by commas or spaces; the sandbox's processes get the same
variable and the folders those packages came from (`op_import_roots`), so they find the same ops.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import Iterable

from kernelloop.kernels.device import configure_triton

configure_triton()  # before any kernel module: Triton decides compiled or interpreted when a kernel is decorated

from kernelloop.common.errors import KernelloopError, UnknownOpError  # noqa: E402
from kernelloop.kernels.spec import OpSpec  # noqa: E402

OP_PACKAGES_ENV = "KERNELLOOP_OP_PACKAGES"
TEMPLATES = "templates"  # an op package's search templates: the agent's, never a spec


def extra_packages() -> tuple[str, ...]:
    """The op packages named in $KERNELLOOP_OP_PACKAGES, in order, without repeats."""
    names = re.split(r"[,\s]+", os.environ.get(OP_PACKAGES_ENV, ""))
    return tuple(dict.fromkeys(n for n in names if n))


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise KernelloopError(f"{OP_PACKAGES_ENV}: cannot import op package {name!r}: {exc}") from None


def _modules(package: str) -> Iterable[ModuleType]:
    """The package itself when it is a plain module, else each of its modules (templates skipped)."""
    root = _import(package)
    if not hasattr(root, "__path__"):
        yield root
        return
    for info in pkgutil.iter_modules(root.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] != TEMPLATES:
            yield importlib.import_module(info.name)


def discover(packages: Iterable[str]) -> dict[str, OpSpec]:
    """Every `SPEC` in `packages`, by op name (sorted); two modules claiming one name is an error."""
    ops: dict[str, OpSpec] = {}
    where: dict[str, str] = {}
    for package in packages:
        for module in _modules(package):
            spec = getattr(module, "SPEC", None)
            if not isinstance(spec, OpSpec):
                continue
            if spec.name in ops and ops[spec.name] is not spec:
                raise KernelloopError(f"op {spec.name!r} is defined twice: in {where[spec.name]} and {module.__name__}")
            ops[spec.name], where[spec.name] = spec, module.__name__
    return dict(sorted(ops.items()))


OPS: dict[str, OpSpec] = discover((__name__, *extra_packages()))


def get_op(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(OPS)}") from None


def baseline_file(name: str) -> Path:
    """The op's baseline kernel file: the module its spec's `forward` comes from."""
    return Path(inspect.getsourcefile(get_op(name).forward) or "")


def baseline_source(name: str) -> str:
    """The op's baseline kernel as a candidate module's text (the file as it is)."""
    return baseline_file(name).read_text()


def op_import_roots() -> list[str]:
    """The sys.path folders the $KERNELLOOP_OP_PACKAGES packages were imported from: what a child
    process's PYTHONPATH needs (with kernelloop's own) to find the same ops."""
    roots: list[str] = []
    for package in extra_packages():
        module = _import(package)
        depth = package.count(".") + 1
        files = list(getattr(module, "__path__", [])) or [str(Path(module.__file__ or "").parent)]
        for path in files:
            up = Path(path).resolve()
            for _ in range(depth - (0 if hasattr(module, "__path__") else 1)):
                up = up.parent
            if str(up) not in roots:
                roots.append(str(up))
    return roots
