"""Compile Triton kernels for a GPU target on a machine without one: registers, spills, shared memory.

Triton compiles a kernel to a cubin for a named target (`GPUTarget("cuda", 90, 32)`) with its
bundled ptxas, no GPU needed. This module finds the launches a Python entry point makes and compiles
each one as the JIT would on that GPU:

    with capture_launches() as launches:    # kernel[grid](...) is recorded, not run
        spec.forward(*meta_inputs(spec, shape, dtype))
    results = [compile_launch(launch, "sm90") for launch in launches]

The signature, the constexprs and the specialisations (an int argument equal to 1 becomes a
constant, pointers and ints divisible by 16 get the divisibility hint) are derived from the captured
arguments with Triton's own specialisation function, so the cubin is the one the GPU would build.
Inputs are meta tensors (`meta_inputs`): an 8192 x 57344 input costs nothing. Registers and spills come from ptxas'
verbose log, shared memory from the compiled kernel's metadata.

This needs compiled Triton: the process must have TRITON_INTERPRET=0 before any `@triton.jit`
runs (interpreted kernels are not JIT functions). `bench/compile_targets.py` is the entry point.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator

from kernelloop.common.errors import KernelloopError

if TYPE_CHECKING:
    from kernelloop.kernels.spec import OpSpec

TARGETS = {"sm80": 80, "sm86": 86, "sm89": 89, "sm90": 90, "sm100": 100, "sm120": 120}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# Shared memory one block may use (CUDA programming guide, "Technical Specifications").
MAX_SHARED_BYTES = {"sm80": 166912, "sm86": 101376, "sm89": 101376, "sm90": 232448, "sm100": 232448, "sm120": 101376}


def parse_targets(text: str) -> tuple[str, ...]:
    """'sm90,sm80' -> ('sm90', 'sm80'); unknown names are a one-line error."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise KernelloopError(f"unknown GPU target {', '.join(unknown) or repr(text)} (known: {', '.join(TARGETS)})")
    return names


@dataclass
class Launch:
    """One `kernel[grid](...)` call: the JIT function and what it was called with."""

    kernel: Any  # triton.runtime.jit.JITFunction
    args: tuple
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@dataclass
class CompileResult:
    """One kernel compiled for one target. `error` is set (and the numbers are None) when it failed."""

    kernel: str
    target: str
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    registers: int | None = None
    spill_bytes: int | None = None  # spill stores + spill loads, as ptxas reports them
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None
    labels: list[str] = field(default_factory=list)  # where this launch came from (op, shape, dtype, config)

    @property
    def problem(self) -> str | None:
        """Why this kernel must not be sent to the GPU: it does not compile, spills, or needs more
        shared memory than the target has (the driver would refuse it at load time)."""
        if self.error:
            return f"does not compile for {self.target}: {self.error}"
        limit = MAX_SHARED_BYTES.get(self.target)
        if self.shared_bytes and limit and self.shared_bytes > limit:
            return f"needs {self.shared_bytes} bytes of shared memory; {self.target} has {limit} per block"
        if self.spill_bytes:
            return f"spills {self.spill_bytes} bytes of registers on {self.target} ({self.registers} registers)"
        return None


def require_compiled_triton() -> None:
    from kernelloop.kernels.device import triton_interpreted

    if triton_interpreted():
        raise KernelloopError("compiling for a GPU target needs compiled Triton: run with TRITON_INTERPRET=0 "
                              "(python -m bench.compile_targets does)")


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every JIT launch made inside the block instead of running it (outputs stay unwritten)."""
    from triton.runtime.jit import JITFunction

    require_compiled_triton()
    launches: list[Launch] = []
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs))

    JITFunction.run = run
    try:
        yield launches
    finally:
        JITFunction.run = original


def meta_inputs(spec: Any, shape: dict[str, int], dtype: Any) -> tuple:
    """The op's inputs at `shape` with no data: `torch.randn` (the data of every op's `make_inputs`)
    returns meta tensors meanwhile, while the host-side structure (lengths, indices, positions) is
    computed for real and then moved to the meta device. A launcher that reads tensor values on the
    host raises here instead of compiling something the GPU would not."""
    import torch

    real = torch.randn

    def randn(*size: Any, generator: Any = None, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        dims = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return torch.empty(dims, dtype=dtype or torch.get_default_dtype(), device="meta")

    torch.randn = randn
    try:
        return spec.make_inputs(shape, dtype, 0, "meta")
    finally:
        torch.randn = real


@lru_cache(maxsize=None)
def _backend(target: str) -> tuple[Any, Any]:
    """(GPUTarget, Triton's compiler backend) for a target name; made once per target."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    gpu = GPUTarget("cuda", TARGETS[target], 32)
    return gpu, make_backend(gpu)


def specialise(launch: Launch, backend: Any) -> tuple[dict[str, str], dict[str, Any], dict[tuple, list], dict[str, int]]:
    """(signature, constexprs, attrs, options) as Triton's JIT derives them from the call's arguments."""
    from triton.runtime.jit import native_specialize_impl

    kernel = launch.kernel
    options = {k: launch.kwargs[k] for k in LAUNCH_OPTIONS if k in launch.kwargs}
    bound = dict(zip([p.name for p in kernel.params], launch.args))
    bound.update({k: v for k, v in launch.kwargs.items() if k not in LAUNCH_OPTIONS})
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = bound[param.name] if param.name in bound else param.default if param.has_default else None
        value = value.value if type(value).__name__ == "constexpr" else value
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
            continue
        kind, key = native_specialize_impl(type(backend), value, param.is_const, not param.do_not_specialize,
                                           not param.do_not_specialize_on_alignment)
        if kind == "constexpr":
            signature[param.name], constexprs[param.name] = "constexpr", key
        else:
            signature[param.name] = kind
            parsed = backend.parse_attr(key) if isinstance(key, str) else []
            if parsed:
                attrs[(i,)] = parsed
    return signature, constexprs, attrs, options


_REGISTERS = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas_log(text: str) -> tuple[int | None, int | None, int | None]:
    """(registers, spill bytes, stack frame bytes) from ptxas' verbose output (`-v`)."""
    regs, frame = _REGISTERS.search(text), _FRAME.search(text)
    if not regs or not frame:
        return None, None, None
    return int(regs.group(1)), int(frame.group(2)) + int(frame.group(3)), int(frame.group(1))


def compile_launch(launch: Launch, target: str) -> CompileResult:
    """Compile one captured launch for `target` (e.g. 'sm90'); never raises for a kernel's own errors."""
    import triton
    from triton import knobs

    gpu, backend = _backend(target)
    signature, constexprs, attrs, options = specialise(launch, backend)
    result = CompileResult(launch.name, target, {k: v for k, v in constexprs.items() if not callable(v)},
                           options.get("num_warps", 4), options.get("num_stages", 3))
    log = io.StringIO()
    start = time.perf_counter()
    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    # ptxas must run (a cached cubin comes without its log, hence without registers and spills)
    knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(triton.compiler.ASTSource(launch.kernel, signature, constexprs, attrs),
                                      target=gpu, options=options)
    except Exception as exc:  # noqa: BLE001  (a kernel that does not compile is a result, not a crash)
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        result.error = (lines[-1] if lines else type(exc).__name__)[:300]
        return result
    finally:
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved
        result.seconds = time.perf_counter() - start
    result.registers, result.spill_bytes, result.stack_bytes = parse_ptxas_log(log.getvalue())
    result.shared_bytes = int(compiled.metadata.shared)
    return result


def launch_key(launch: Launch) -> str:
    """Identity of what a launch compiles to, on one target (kernels with equal keys build one cubin)."""
    signature, constexprs, attrs, options = specialise(launch, _backend("sm90")[1])
    return repr((launch.kernel.fn.__module__, launch.kernel.fn.__qualname__, id(launch.kernel), sorted(signature.items()),
                 sorted((k, repr(v)) for k, v in constexprs.items()), sorted(attrs.items()), sorted(options.items())))


def device_target(index: int = 0) -> str | None:
    """This machine's GPU as a target name ('sm90'), None without CUDA or for an unknown capability."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    name = f"sm{major * 10 + minor}"
    return name if name in TARGETS else None


def source_problems(source: str, spec: OpSpec, shapes: list[dict[str, int]], dtype: Any, target: str) -> list[str]:
    """What stops a trusted source's kernels (a search template, a registry entry) from running well on
    `target` at `shapes`: compile errors, spills, too much shared memory. Empty when it fits."""
    from kernelloop.kernels.registry.entry import sha256_text
    from kernelloop.kernels.registry.loader import load_forward

    forward = load_forward(source, sha256_text(source), f"{spec.name} candidate")
    problems, seen = [], set()
    for shape in shapes:
        with capture_launches() as launches:
            forward(*meta_inputs(spec, shape, dtype))
        for launch in launches:
            key = launch_key(launch)
            if key not in seen:
                seen.add(key)
                problem = compile_launch(launch, target).problem
                if problem:
                    problems.append(f"{launch.name}: {problem}")
    return problems
