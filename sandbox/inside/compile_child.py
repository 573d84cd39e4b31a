"""The compile process of `--compile-for`: a candidate's described launches compiled for GPU targets.

A fresh process in compiled Triton (TRITON_INTERPRET=0), confined like every sandboxed process
(sandbox/inside/confine.py; it may execute Triton's bundled ptxas and nothing else), in which no candidate
Python ever ran: the kernels are rebuilt from the judge's copy of the source by sandbox/inside/replay.py's
`kernels_from_source` (the kernel part of its canonical text, as the replayer does; compiled Triton
turns their bodies into IR and never runs them). After "ready" and "load" it answers one "compile" message
{"targets": ["sm90", ...], "launches": [{"kernel", "args", "kwargs"}, ...]} with "compiled":

    {"launches": [{"compiled": i or None, "ident": str or None, "error": str or None}, ...],
     "results": [{"sm90": {CompileResult fields}, ...}, ...]}     one entry per distinct cubin i

`ident` names what decides registers and spills (kernel, declared constexprs, launch options), for
the judge's comparison of described and recorded launches. Every description is decoded as
untrusted data: an unknown kernel, argument or option is that launch's `error`, never a crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelloop.kernels.target_compile import TARGETS, CompileResult, Launch, compile_launch, specialise
from kernelloop.sandbox import wire
from kernelloop.sandbox.inside import guards
from kernelloop.sandbox.inside.replay import ReplayError, kernels_from_source
from kernelloop.sandbox.messages import Compiled, CompiledFields, CompiledLaunch, Job, Load, parse

MAX_LAUNCHES = 256  # the judge sends at most 16 per shape, 3 groups per dtype
MAX_ARGS = 64
MAX_DEPTH = 4
OPTION_VALUES = {"num_warps": (1, 2, 4, 8, 16, 32), "num_stages": tuple(range(1, 9)), "num_ctas": (1, 2, 4, 8, 16),
                 "maxnreg": tuple(range(16, 256))}
IGNORED_OPTIONS = frozenset({"enable_fp_fusion", "launch_cooperative_grid", "launch_pdl", "debug"})


class DescriptionError(ValueError):
    """A launch description that cannot stand for a launch of the candidate's kernels."""


def _arg(value: Any, depth: int = 0) -> Any:
    import torch
    import triton.language as tl

    if value is None or type(value) in (bool, float) or (type(value) is str and len(value) <= 256):
        return value
    if type(value) is int:
        if not -(1 << 63) <= value < 1 << 64:
            raise DescriptionError("an integer argument out of 64-bit range")
        return value
    if isinstance(value, dict) and "ptr" in value:
        dtype = wire.WIRE_DTYPES.get(value.get("dtype")) if isinstance(value.get("dtype"), str) else None
        offset = value.get("byte_offset")
        if dtype is None or type(offset) is not int or offset < 0 or offset % dtype.itemsize:
            raise DescriptionError("a malformed pointer argument")
        # A meta tensor as misaligned as the real pointer: Triton's specialisation reads dtype and data_ptr % 16.
        return torch.empty(16, dtype=dtype, device="meta")[offset % 16 // dtype.itemsize:]
    if isinstance(value, dict) and len(value) == 1 and depth < MAX_DEPTH:
        (key, inner), = value.items()
        if key == "constexpr":
            return tl.constexpr(_arg(inner, depth + 1))
        if key == "tl_dtype" and inner in tl.dtype.SINT_TYPES + tl.dtype.UINT_TYPES + tl.dtype.FP_TYPES:
            return tl.dtype(inner)
        if key == "seq" and isinstance(inner, list) and len(inner) <= MAX_ARGS:
            return tuple(_arg(v, depth + 1) for v in inner)
    raise DescriptionError(f"an argument that is not a launch argument: {str(value)[:60]}")


def decode(table: dict[str, Any], description: Any) -> Launch:
    """One description as a Launch of the rebuilt kernel, or DescriptionError."""
    if not isinstance(description, dict):
        raise DescriptionError("a launch description must be an object")
    name, args, kwargs = description.get("kernel"), description.get("args"), description.get("kwargs")
    kernel = table.get(name) if isinstance(name, str) else None
    if kernel is None:
        raise DescriptionError(f"kernel {str(name)[:60]!r} is not a top-level @triton.jit function of its source")
    if not isinstance(args, list) or not isinstance(kwargs, dict) or len(args) + len(kwargs) > MAX_ARGS:
        raise DescriptionError(f"kernel {name}: malformed arguments")
    params = [p.name for p in kernel.params]
    if len(args) > len(params):
        raise DescriptionError(f"kernel {name}: {len(args)} arguments for {len(params)} parameters")
    given = set(params[:len(args)])
    for key, value in kwargs.items():
        if key in OPTION_VALUES:
            if value not in OPTION_VALUES[key] or type(value) is not int:
                raise DescriptionError(f"kernel {name}: {key}={str(value)[:20]} is not a valid launch option")
        elif key in given or (key not in params and key not in IGNORED_OPTIONS):
            raise DescriptionError(f"kernel {name}: unexpected keyword argument {key[:40]!r}")
        given.add(key)
    missing = [p.name for p in kernel.params if p.name not in given and not p.has_default]
    if missing:
        raise DescriptionError(f"kernel {name}: missing argument {missing[0]!r}")
    return Launch(kernel, tuple(_arg(a) for a in args),
                  {k: _arg(v) for k, v in kwargs.items() if k not in IGNORED_OPTIONS})


def _plain(value: Any) -> Any:
    return value if value is None or type(value) in (bool, int, float, str) else str(value)[:100]


def result_fields(result: CompileResult) -> CompiledFields:
    return CompiledFields(kernel=result.kernel, registers=result.registers, spill_bytes=result.spill_bytes,
                          stack_bytes=result.stack_bytes, shared_bytes=result.shared_bytes, num_warps=result.num_warps,
                          num_stages=result.num_stages, constexprs={k: _plain(v) for k, v in result.constexprs.items()},
                          seconds=round(result.seconds, 3), error=result.error)


def compile_descriptions(table: dict[str, Any], launches: Any, targets: Any) -> Compiled:
    """The "compiled" answer (see the module docstring)."""
    from kernelloop.kernels.target_compile import _backend

    if not isinstance(targets, list) or not targets or not all(t in TARGETS for t in targets) \
            or not isinstance(launches, list) or len(launches) > MAX_LAUNCHES:
        raise wire.ProtocolError("malformed compile message")
    backend = _backend("sm90")[1]
    answers: list[CompiledLaunch] = []
    keys, distinct = {}, []
    for description in launches:
        try:
            launch = decode(table, description)
            signature, constexprs, attrs, options = specialise(launch, backend)
        except Exception as exc:  # noqa: BLE001  (whatever a description makes Triton's specialisation raise)
            answers.append(CompiledLaunch(compiled=None, ident=None, error=str(exc).splitlines()[0][:300] if str(exc)
                                          else type(exc).__name__))
            continue
        declared = {p.name for p in launch.kernel.params if p.is_constexpr}
        ident = json.dumps([launch.name, sorted((k, repr(v)) for k, v in constexprs.items() if k in declared),
                            sorted(options.items())])
        key = repr((launch.name, sorted(signature.items()), sorted((k, repr(v)) for k, v in constexprs.items()),
                    sorted(attrs.items()), sorted(options.items())))
        if key not in keys:
            keys[key] = len(distinct)
            distinct.append(launch)
        answers.append(CompiledLaunch(compiled=keys[key], ident=ident, error=None))
    results = [{target: result_fields(compile_launch(launch, target)) for target in targets} for launch in distinct]
    return Compiled(type="compiled", launches=answers, results=results)


def serve_compiles(chan: wire.Channel, job: Job) -> None:
    """The compile process: rebuild the kernels from the judge's copy of the source, answer one "compile"."""
    from kernelloop.kernels.device import triton_interpreted

    guards.install_audit_hook(Path(job["scratch"]), frozenset(job.get("allow_exec", ())))
    if triton_interpreted() or not isinstance(job.get("source"), str):
        chan.send(Load(type="load", ok=False, error="the compile process needs compiled Triton and a source",
                       constants={}, violations=guards.VIOLATIONS[:5]))
        return
    try:
        table = kernels_from_source(job["source"], job.get("constants", {}))
    except ReplayError as exc:
        chan.send(Load(type="load", ok=False, error=str(exc), constants={}, violations=guards.VIOLATIONS[:5]))
        return
    chan.send(Load(type="load", ok=True, error=None, constants={}, violations=guards.VIOLATIONS[:5]))
    header = parse(chan.receive()[0], "compile")
    chan.send(compile_descriptions(table, header["launches"], header["targets"]))
