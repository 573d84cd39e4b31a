"""Every message between the judge and its sandboxed processes, and the plan: one typed definition each.

TypedDicts, so a message is still a plain dict of JSON values on the wire (sandbox/wire.py frames it;
never pickle) and the same definition serves the sender, the reader and the type checker.

    judge -> child    Job (once, through the fork server or stdin), then
                      runner:   Call -> Result;  Capture -> Captured (--compile-for)
                      replayer: Stage -> Staged, Go -> Done
                      compile:  Compile -> Compiled
    child -> judge    Ready, then Load, first of all; Error instead of any reply
    fork server       StartRequest -> StartReply, WaitRequest -> WaitReply (the judge's own helper)
    the plan          Plan, Trial, Timing: the judge's, never sent (sandbox/judge/plan.py makes it)

A child's reply is untrusted. `parse(header, kind, ...)` refuses (wire.ProtocolError) a message whose
keys are not exactly its declared ones or whose values are not of the declared types, before anyone
reads a field; values typed `Any` (records, launch descriptions, constants) are checked further where
they are used (sandbox/inside/replay.py, compile_child.py, compile_check.py). Typed is not trusted: counts,
sizes and contents remain the judge's to check. The wire's own `tensors` key is wire.py's to check.
"""

# No `from __future__ import annotations`: TypedDict must see NotRequired[...] itself (Python 3.11).
import math
import types
import typing
from functools import cache
from typing import Any, Literal, NotRequired, TypedDict, Union

from kernelloop.sandbox.wire import ProtocolError

# -- judge -> child -------------------------------------------------------------------------------


class Job(TypedDict):
    """What a sandboxed process is started with (worker.child_main); `scratch` is added by children.Child."""

    role: Literal["run", "replay", "compile"]
    op: str
    device: str  # the Device's kind ("cpu", "cuda"); the child takes Device.of(it)
    source: str | None  # None: the op's own (trusted) baseline kernel
    filename: str
    constants: dict[str, Any]  # the runner's Load.constants, for the replayer and the compile process
    memory_mb: int
    cpu_seconds: int
    confine: bool
    allow_exec: list[str]
    scratch: NotRequired[str]
    own_session: NotRequired[bool]  # False in fresh-interpreter mode (worker.run_fresh)


class Call(TypedDict):
    """One `forward(*args)`: a tensor argument is {"tensor": i}, the i-th tensor of the message.
    `config`: the slot that pins every autotuned kernel's config for this call (kernels/interpreter_autotune.py);
    absent: the device's own choice, as the engine makes it."""

    type: Literal["call"]
    args: list[Any]
    config: NotRequired[int]


class Go(TypedDict):
    """Run the staged record. `order`: absent, the grid's programs in grid order; a seed, in a shuffled
    order drawn from it on the CPU interpreter (kernels/interpreter_order.py), beside a concurrent load
    on CUDA (a race shows as different bits)."""

    type: Literal["go"]
    order: NotRequired[int]


class CaptureRequest(TypedDict):
    shape: dict[str, int]
    dtype: str


class Capture(TypedDict):
    type: Literal["capture"]
    requests: list[CaptureRequest]


class Compile(TypedDict):
    type: Literal["compile"]
    targets: list[str]
    launches: list[Any]  # descriptions, decoded as untrusted data by compile_child.decode


# -- child -> judge (untrusted) -------------------------------------------------------------------


class Ready(TypedDict):
    type: Literal["ready"]
    isolation: dict[str, str]  # each confinement layer as set up


class Load(TypedDict):
    """The module (runner) or its kernels (replayer, compile process) loaded, or not."""

    type: Literal["load"]
    ok: bool
    error: str | None
    constants: dict[str, Any]  # the runner's plain module constants; {} elsewhere
    violations: list[str]


class Error(TypedDict):
    """A harness-side failure in the child, sent instead of the expected reply."""

    type: Literal["error"]
    error: str
    violations: list[str]


class Facts(TypedDict):
    """What the runner saw during one call: facts about the candidate, which can only hurt it."""

    error: str | None
    memory: bool
    launches: int
    torch_ops: list[str]
    violations: list[str]
    count: int  # outputs returned
    types: list[str]  # their type names
    devices: list[str]  # their devices, when all are plain tensors that can cross the channel


class Record(TypedDict):
    """How a call made its outputs (sandbox/inside/trace.py); entries and refs are checked by the replay."""

    entries: list[dict[str, Any]]
    outputs: list[Any]
    inputs: int
    problem: str | None


class Result(TypedDict):
    """Tensors: the `outputs` outputs, then the inputs as they were after the call."""

    type: Literal["result"]
    facts: Facts
    record: Record
    outputs: int


class Stage(TypedDict):
    """A runner's record, to replay on the call's inputs (the message's tensors); judge -> replayer."""

    type: Literal["stage"]
    record: Record


class Staged(TypedDict):
    type: Literal["staged"]


class Done(TypedDict):
    """A replay. Tensors: the `outputs` outputs, then the inputs afterwards. `elapsed_s`: CUDA event time."""

    type: Literal["done"]
    elapsed_s: float | None
    error: str | None
    outputs: int
    violations: list[str]


class CapturedShape(TypedDict):
    launches: list[Any]  # descriptions in the record's launch format (sandbox/inside/capture.py)
    error: str | None


class Captured(TypedDict):
    type: Literal["captured"]
    shapes: list[CapturedShape]
    violations: list[str]


class CompiledLaunch(TypedDict):
    compiled: int | None  # index into Compiled.results
    ident: str | None
    error: str | None


class CompiledFields(TypedDict):
    """One kernel compiled for one target (kernels.target_compile.CompileResult, less target and labels)."""

    kernel: str
    registers: int | None
    spill_bytes: int | None
    stack_bytes: int | None
    shared_bytes: int | None
    num_warps: int | None
    num_stages: int | None
    constexprs: dict[str, Any]
    seconds: float
    error: str | None


class Compiled(TypedDict):
    type: Literal["compiled"]
    launches: list[CompiledLaunch]
    results: list[dict[str, CompiledFields]]  # per distinct cubin: target -> fields


ToChild = Union[Call, Stage, Go, Capture, Compile]
TO_CHILD = (Call, Stage, Go, Capture, Compile)
FROM_CHILD = (Ready, Load, Error, Result, Staged, Done, Captured, Compiled)
KINDS: dict[str, type] = {typing.get_args(typing.get_type_hints(cls)["type"])[0]: cls for cls in TO_CHILD + FROM_CHILD}


# -- the fork server (sandbox/judge/forkserver.py; trusted on both ends) ------------------------------


class StartRequest(TypedDict):
    op: Literal["start"]
    id: int
    job: Job


class WaitRequest(TypedDict):
    op: Literal["wait"]
    id: int
    pid: int


class StartReply(TypedDict):
    id: int
    pid: int


class WaitReply(TypedDict):
    id: int
    status: int | None  # exit status; negative: killed by that signal


# -- the plan (sandbox/judge/plan.py; never leaves the judge) -------------------------------------------


class Trial(TypedDict):
    id: int
    shape: dict[str, int]
    variant: dict[str, Any]  # the op's input variant (seeded scalars, layouts, magnitudes); {} for plain
    dtype: str
    seed: int
    determinism: bool  # also call twice on the same inputs: the bits must not change
    race_only: NotRequired[bool]  # float32 for a kernel with atomics judged without it: only races are judged


class Timing(TypedDict):
    shape: dict[str, int]
    dtype: str
    rounds: list[list[int]]  # a seed per call, per round
    confirm: NotRequired[list[list[int]]]  # as many again, fresh seeds: rounds run when the first look is unsure
    asked_shape: NotRequired[dict[str, int]]  # the caller's shape, where the CPU times a smaller one


class Plan(TypedDict):
    trials: list[Trial]
    timing: Timing | None


# -- checking ---------------------------------------------------------------------------------------


@cache
def _fields(cls: type) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    return typing.get_type_hints(cls), frozenset(cls.__required_keys__), frozenset(cls.__optional_keys__)


def _shown(value: Any) -> str:
    return repr(value)[:40] if isinstance(value, (int, float, str)) or value is None else type(value).__name__


def conform(value: Any, hint: Any, where: str) -> None:
    """Raise ProtocolError unless `value` is exactly of the declared type `hint` (a TypedDict: exactly
    its keys). Ints are never bools; a float may be an int, never NaN or infinite."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, got {_shown(value)}")
        hints, required, optional = _fields(hint)
        missing, extra = sorted(required - value.keys()), sorted(map(str, value.keys() - required - optional))
        if missing:
            raise ProtocolError(f"{where} lacks its declared key {missing[0]!r}")
        if extra:
            raise ProtocolError(f"{where} has an undeclared key {extra[0][:40]!r}")
        for key, item in value.items():
            conform(item, hints[key], f"{where}.{key}")
    elif origin is Literal:
        if value not in args or type(value) is not type(args[0]):
            raise ProtocolError(f"{where} must be one of {list(args)}, got {_shown(value)}")
    elif origin in (Union, types.UnionType):
        for option in args:
            try:
                return conform(value, option, where)
            except ProtocolError:
                pass
        names = ["null" if a is type(None) else getattr(a, "__name__", str(a)) for a in args]
        raise ProtocolError(f"{where} must be {' or '.join(names)}, got {_shown(value)}")
    elif origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, got {_shown(value)}")
        for i, item in enumerate(value):
            conform(item, args[0], f"{where}[{i}]")
    elif origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, got {_shown(value)}")
        for key, item in value.items():
            conform(key, args[0], f"{where} key")
            conform(item, args[1], f"{where}[{str(key)[:40]!r}]")
    elif hint is type(None):
        if value is not None:
            raise ProtocolError(f"{where} must be null, got {_shown(value)}")
    elif hint is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ProtocolError(f"{where} must be a finite number, got {_shown(value)}")
    elif type(value) is not hint:  # str, int, bool
        raise ProtocolError(f"{where} must be {hint.__name__}, got {_shown(value)}")


def parse(header: dict[str, Any], *kinds: str) -> Any:
    """`header` (as wire.Channel.receive returned it) if it is one of `kinds`, exactly as declared;
    else ProtocolError saying which key or value is wrong. Its wire-level `tensors` key is dropped."""
    kind = header.get("type")
    if kind not in kinds:
        raise ProtocolError(f"expected a {' or '.join(repr(k) for k in kinds)} message, got {_shown(kind)}")
    message = {k: v for k, v in header.items() if k != "tensors"}
    conform(message, KINDS[kind], f"the {kind!r} message")
    return message
