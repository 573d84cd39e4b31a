"""Replaying a recorded call (sandbox/inside/trace.py) in a process where the candidate's Python never ran.

The replay process gets the candidate's source from the judge, not from the candidate's process. It
executes only the kernel part of its canonical text (sandbox/inside/replay_source.py: the jit definitions,
undecorated, whether decorated or jitted by assignment, the `triton`/`math` imports, and the
module-level `if`/`try` blocks around them), with the plain constants the runner reported (numbers,
strings, `tl.constexpr` of those), and builds the kernels from that. Then, per call, it redoes the record on
the inputs the judge sent: the data-moving aten ops (only those in trace.DATA_ATEN) and the kernel
launches, nothing else. Top-level code, the launcher, helper classes: none of it exists here. On a GPU
no candidate Python runs at all (compiled kernels are not Python); on the CPU interpreter the kernel
bodies run as Python, which is why the judge, not this process, holds the clock there.

Every field of a record is checked before use; anything off raises `ReplayError`.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import keyword
import linecache
import math
from typing import Any

import torch

from kernelloop.kernels import interpreter_bounds as bounds
from kernelloop.kernels.device import Device
from kernelloop.sandbox.inside import poison
from kernelloop.sandbox.inside.program_order import program_order
from kernelloop.sandbox.inside.replay_memory import Buffers
from kernelloop.sandbox.inside.trace import ALLOCATORS, DATA_ATEN, FILLS, LITERAL_DTYPES, MAX_ENTRIES, MAX_PYTHON_VALUES
from kernelloop.sandbox.wire import WIRE_DTYPES, check_meta

KERNEL_MODULES = ("triton", "math", "__future__")
_SAFE_BUILTINS = ("range", "len", "min", "max", "abs", "int", "float", "bool", "isinstance", "tuple", "list",
                  "dict", "zip", "enumerate", "print", "ValueError", "TypeError", "AssertionError",
                  "RuntimeError", "Exception", "NotImplementedError", "True", "False", "None", "round", "str")


# What a kernel body may name and reach: Triton language, math, its own module's kernels and constants.
KERNEL_REACHABLE_MODULES = frozenset({
    "triton", "triton.language", "triton.language.math", "triton.language.extra", "triton.language.extra.libdevice",
    "triton.language.extra.cuda", "triton.language.extra.cuda.libdevice", "math"})
TRITON_TOP_LEVEL = frozenset({"language", "cdiv", "next_power_of_2", "constexpr", "jit"})
FORBIDDEN_KERNEL_ATTRIBUTES = frozenset({"handle", "data", "fn", "src", "rewrite", "builder", "cache"})
_NOT_IN_KERNELS = (ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.ClassDef, ast.Lambda,
                   ast.AsyncFunctionDef, ast.Await, ast.Yield, ast.YieldFrom, ast.Try, ast.With, ast.AsyncWith,
                   ast.Delete)


class ReplayError(Exception):
    """The record cannot be replayed as written: the candidate is `untraceable`."""


def _chain(node: ast.Attribute) -> tuple[str | None, list[str]]:
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs[::-1]


def check_kernel_body(fn: ast.FunctionDef, namespace: dict[str, Any]) -> None:
    """A kernel body is Triton language, as compiled Triton's frontend requires: it may name its own
    locals and parameters, the module's kernels, constants and triton/math imports, and a few
    builtins; attribute chains from a module stay inside Triton's language modules; no private
    attributes, no interpreter internals (`.handle`, `.data`). Under the CPU interpreter kernel bodies
    run as Python in the replayer: this is what keeps them from reaching anything else there."""
    import types

    bound = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    bound |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a}
    bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    known = bound | set(namespace) | set(_SAFE_BUILTINS)
    where = f"kernel {fn.name}"
    for node in ast.walk(fn):
        line = f"{where}, line {getattr(node, 'lineno', '?')}"
        if isinstance(node, _NOT_IN_KERNELS) or (isinstance(node, ast.FunctionDef) and node is not fn):
            raise ReplayError(f"{line}: {type(node).__name__} is not Triton language")
        if isinstance(node, ast.Name) and node.id not in known:
            raise ReplayError(f"{line}: {node.id!r} is not a local, a parameter, a kernel, a constant or a "
                              "triton/math import of the module")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr in FORBIDDEN_KERNEL_ATTRIBUTES:
                raise ReplayError(f"{line}: attribute .{node.attr} is not Triton language")
            root, attrs = _chain(node)
            if root is None or root in bound or not isinstance(namespace.get(root), types.ModuleType):
                continue
            obj = namespace[root]
            for i, attr in enumerate(attrs):
                if obj.__name__ == "triton" and attr not in TRITON_TOP_LEVEL:
                    raise ReplayError(f"{line}: triton.{attr} is not Triton language")
                obj = getattr(obj, attr, None)
                if isinstance(obj, types.ModuleType) and obj.__name__ not in KERNEL_REACHABLE_MODULES:
                    raise ReplayError(f"{line}: {root}.{'.'.join(attrs[:i + 1])} reaches module {obj.__name__}")


def _restricted_import(name: str, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002, ANN001
    private = any(p.startswith("_") for p in name.split(".")[1:]) or any(str(f).startswith("_") for f in fromlist or ())
    if level or name.split(".")[0] not in KERNEL_MODULES or private:
        raise ImportError(f"the replay only imports triton and math, not {name!r}")
    return builtins.__import__(name, globals, locals, fromlist, level)


def _constant(name: Any, value: Any) -> Any:
    import triton.language as tl

    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
        raise ReplayError(f"bad constant name {str(name)[:40]!r}")
    if isinstance(value, dict) and set(value) == {"constexpr"}:
        return tl.constexpr(_constant(name, value["constexpr"]))
    if value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) < 256):
        return value
    raise ReplayError(f"constant {name} is not a plain number or string")


def kernels_from_source(source: str, constants: Any) -> dict[str, Any]:
    """name -> Triton kernel, rebuilt from the kernel part of the source's canonical text
    (sandbox/inside/replay_source.py: kernels, their triton/math imports, the `if`/`try` around them),
    compiled under the canonical text's label and line numbers, which linecache holds."""
    import triton

    from kernelloop.kernels.candidate.canonical import CanonicalError, canonical
    from kernelloop.kernels.candidate.loader import MODULE_NAME
    from kernelloop.sandbox.inside.replay_source import StructureError, kernel_part

    if not isinstance(constants, dict) or len(constants) > 4096:
        raise ReplayError("constants must be an object of at most 4096 names")
    namespace: dict[str, Any] = {name: _constant(name, value) for name, value in constants.items()}
    try:
        canon = canonical(source)
        module, kernels = kernel_part(canon.tree, KERNEL_MODULES, set(namespace))
    except (CanonicalError, StructureError) as exc:
        raise ReplayError(str(exc)) from None
    linecache.cache[canon.label] = (len(canon.text), None, canon.text.splitlines(keepends=True), canon.label)
    safe = {k: getattr(builtins, k) for k in _SAFE_BUILTINS + ("ImportError", "ModuleNotFoundError", "AttributeError")}
    namespace.update(__builtins__={**safe, "__import__": _restricted_import}, __name__=MODULE_NAME)
    try:
        exec(compile(module, canon.label, "exec", dont_inherit=True), namespace)
    except Exception as exc:  # noqa: BLE001 (the candidate's text; any failure is its own)
        raise ReplayError(f"rebuilding the kernels failed: {type(exc).__name__}: {exc}") from None
    built = [node for node in kernels if getattr(namespace.get(node.name), "__code__", None) is not None
             and namespace[node.name].__code__.co_firstlineno == node.lineno]  # the branches taken
    for node in built:
        check_kernel_body(node, namespace)
    jitted = {id(namespace[node.name]): triton.jit(namespace[node.name]) for node in built}
    for name, value in list(namespace.items()):  # the kernel's own name and the names assigned to it
        if id(value) in jitted:
            namespace[name] = jitted[id(value)]
    return {node.name: namespace[node.name] for node in built}


def kernels_from_module(module_name: str) -> dict[str, Any]:
    """The trusted op baseline's kernels (the module an op spec's `forward` comes from), by name."""
    import importlib

    from triton.runtime import interpreter, jit

    from kernelloop.kernels.ops import OPS

    if module_name not in {spec.forward.__module__ for spec in OPS.values()}:
        raise ReplayError(f"{module_name} is not an op's baseline kernel module")
    module = importlib.import_module(module_name)
    kinds = (jit.JITFunction, interpreter.InterpretedFunction)
    return {k: v for k, v in vars(module).items() if isinstance(v, kinds)}


class Replay:
    """Redoes one record on given inputs. `device`: where buffers live.

    Memory (sandbox/inside/replay_memory.py): every buffer made during the call sits between guard zones,
    poisoned with a pattern drawn per allocation; interpreted launches have every load and store
    checked against the buffers they were given (`check_addresses`, off only to test the guards).
    `check_guards()` after `run` refuses a store into a guard zone. Both raise
    kernels.interpreter_bounds.OutOfBounds."""

    def __init__(self, kernels: dict[str, Any], device: Device, check_addresses: bool = True) -> None:
        self.kernels, self.device = kernels, device.torch
        self.check_addresses = check_addresses
        self.buffers = Buffers([], self.device)
        self.poison_seed = poison.fresh_seed()  # every replay in this process poisons alike
        if check_addresses:
            bounds.install()

    def run(self, record: Any, inputs: list[torch.Tensor], order: int | None = None) -> list[torch.Tensor]:
        """The record's outputs, computed on `inputs`; `order` seeds the programs' order
        (sandbox/inside/program_order.py), None runs them in grid order."""
        with program_order(order, self.device):
            return self._run(record, inputs)

    def _run(self, record: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not isinstance(record, dict) or not isinstance(record.get("entries"), list):
            raise ReplayError("malformed record")
        if record.get("inputs") != len(inputs) or len(record["entries"]) > MAX_ENTRIES:
            raise ReplayError("the record does not match the call's inputs")
        poison.repeat_from(self.poison_seed)
        self.buffers, self._values = Buffers(inputs, self.device), 0
        for entry in record["entries"]:
            if not isinstance(entry, dict):
                raise ReplayError("malformed record entry")
            if entry.get("kind") == "aten":
                self._aten(entry)
            elif entry.get("kind") == "launch":
                self._launch(entry)
            elif entry.get("kind") == "literal":
                self._literal(entry)
            else:
                raise ReplayError("unknown record entry")
        outs = record.get("outputs")
        if not isinstance(outs, list) or not outs:
            raise ReplayError("the record has no outputs")
        return [self._view(ref) for ref in outs]

    def check_guards(self) -> None:
        """After `run`: OutOfBounds if a kernel wrote into the guard zone of a buffer made during the call."""
        self.buffers.check_guards()

    def _storage(self, buf: Any) -> tuple[Any, int, int]:
        if type(buf) is not int or not 0 <= buf < len(self.buffers):
            raise ReplayError(f"reference to unknown buffer {str(buf)[:20]}")
        return self.buffers.storage(buf)

    def _view(self, ref: Any) -> torch.Tensor:
        if not isinstance(ref, dict):
            raise ReplayError("malformed tensor reference")
        storage, base, nbytes = self._storage(ref.get("buf"))
        try:
            dtype, shape, stride, offset, _ = check_meta({**ref, "nbytes": nbytes})
        except Exception as exc:  # noqa: BLE001
            raise ReplayError(f"bad tensor reference: {exc}") from None
        start = base // dtype.itemsize + offset
        return torch.empty(0, dtype=dtype, device=self.device).set_(storage, start, shape, stride)

    def _values_from_python(self, n: int) -> None:
        self._values += n
        if self._values > MAX_PYTHON_VALUES:
            raise ReplayError(f"more than {MAX_PYTHON_VALUES} values written into tensors from Python in one call")

    def _decode(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self._decode(v) for v in value]
        if isinstance(value, dict) and len(value) == 1:
            (key, inner), = value.items()
            if key == "tensor":
                return self._view(inner)
            if key == "seq" and isinstance(inner, list):
                return [self._decode(v) for v in inner]
            if key == "dtype" and inner in WIRE_DTYPES:
                return WIRE_DTYPES[inner]
            if key == "device":
                return self.device if inner == "cuda" else torch.device("cpu")
            if key == "enum" and inner in ("strided", "contiguous_format", "preserve_format", "channels_last"):
                return getattr(torch, inner)
        raise ReplayError(f"cannot decode argument {str(value)[:60]}")

    def _aten(self, entry: dict) -> None:
        parts = str(entry.get("op", "")).split(".")
        if len(parts) != 3 or parts[0] != "aten" or parts[1] not in DATA_ATEN or not parts[2].isidentifier() \
                or parts[2].startswith("_"):
            raise ReplayError(f"aten op {str(entry.get('op'))[:60]!r} is not replayable")
        try:
            func = getattr(getattr(torch.ops.aten, parts[1]), parts[2])
        except AttributeError:
            raise ReplayError(f"unknown aten op {entry['op']}") from None
        args, kwargs = self._decode(entry.get("args")), entry.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ReplayError("malformed aten arguments")
        if parts[1] in FILLS:
            self._values_from_python(1)
        try:
            out = func(*args, **{str(k): self._decode(v) for k, v in kwargs.items()})
        except Exception as exc:  # noqa: BLE001
            raise ReplayError(f"{entry['op']} failed in the replay: {type(exc).__name__}") from None
        outs = out if isinstance(out, (list, tuple)) else [out]
        news = entry.get("new")
        if not isinstance(news, list) or len(news) != len(outs):
            raise ReplayError("malformed aten outputs")
        for t, new in zip(outs, news):
            if new is None:
                continue
            if new != len(self.buffers) or not isinstance(t, torch.Tensor):
                raise ReplayError("buffers are numbered out of order")
            fresh = parts[1] in ALLOCATORS
            self.buffers.make(t.untyped_storage().nbytes(), t.dtype, entry["op"], source=None if fresh else t)

    def _literal(self, entry: dict) -> None:
        """Index data the launcher made from Python ints (trace.Recorder._lift)."""
        dtype = WIRE_DTYPES.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
        shape, values, new = entry.get("shape"), entry.get("values"), entry.get("new")
        if dtype not in LITERAL_DTYPES:
            raise ReplayError("a literal must be integer or bool data")
        if not (isinstance(shape, list) and len(shape) <= 8 and all(type(d) is int and d >= 0 for d in shape)
                and isinstance(values, list) and len(values) == math.prod(shape) > 0
                and all(type(v) is int for v in values) and new == [len(self.buffers)]):
            raise ReplayError("malformed literal")
        self._values_from_python(len(values))
        try:
            t = torch.tensor(values, dtype=dtype).reshape(shape).to(self.device)
        except (RuntimeError, OverflowError, ValueError):
            raise ReplayError(f"a literal's values do not fit {entry['dtype']}") from None
        self.buffers.make(t.untyped_storage().nbytes(), dtype, "a literal", source=t)

    def _kernel_arg(self, value: Any) -> Any:
        import triton.language as tl

        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, dict) and "ptr" in value:
            storage, base, nbytes = self._storage(value.get("ptr"))
            dtype = WIRE_DTYPES.get(value.get("dtype")) if isinstance(value.get("dtype"), str) else None
            off = value.get("byte_offset")
            if dtype is None or type(off) is not int or not 0 <= off <= nbytes or off % dtype.itemsize:
                raise ReplayError("bad pointer argument")
            count = (nbytes - off) // dtype.itemsize
            return torch.empty(0, dtype=dtype, device=self.device).set_(storage, (base + off) // dtype.itemsize,
                                                                         (count,), (1,))
        if isinstance(value, dict) and len(value) == 1:
            (key, inner), = value.items()
            if key == "constexpr":
                return tl.constexpr(self._kernel_arg(inner))
            if key == "tl_dtype" and isinstance(inner, str) and inner in tl.dtype.SINT_TYPES + tl.dtype.UINT_TYPES \
                    + tl.dtype.FP_TYPES + tl.dtype.OTHER_TYPES:
                return tl.dtype(inner)
            if key == "seq" and isinstance(inner, list):
                return tuple(self._kernel_arg(v) for v in inner)
        raise ReplayError(f"cannot decode kernel argument {str(value)[:60]}")

    def _launch(self, entry: dict) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        kernel = self.kernels.get(entry.get("kernel")) if isinstance(entry.get("kernel"), str) else None
        if kernel is None:
            raise ReplayError(f"kernel {str(entry.get('kernel'))[:60]!r} is not a top-level @triton.jit function")
        grid, args, kwargs = entry.get("grid"), entry.get("args"), entry.get("kwargs")
        if not (isinstance(grid, list) and len(grid) == 3 and all(type(g) is int and 0 <= g < 1 << 31 for g in grid)):
            raise ReplayError("bad grid")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ReplayError("malformed launch arguments")
        if 0 in grid:
            return
        args = [self._kernel_arg(a) for a in args]
        kwargs = {str(k): self._kernel_arg(v) for k, v in kwargs.items()}
        checked = contextlib.nullcontext()
        if self.check_addresses and isinstance(kernel, InterpretedFunction):
            names = list(getattr(kernel, "arg_names", []))
            checked = bounds.checking(self.buffers.launch_bounds(entry["kernel"], names, args, kwargs))
        with checked:
            kernel[tuple(grid)](*args, **kwargs)
