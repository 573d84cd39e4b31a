"""`--compile-for`: the judge's side of compiling a candidate's kernels for GPU targets, on CPU.

After a correct battery, per checked dtype, at the op's largest test shape and its largest engine shape:
1. the runner (the candidate's own process) describes the launches its `forward` makes there on meta
   inputs ("capture", sandbox/inside/capture.py): a claim, nothing more;
2. a fresh compiled-Triton process, confined, where no candidate Python ever ran, rebuilds the kernels
   from the judge's copy of the source and compiles for each target the described launches and the
   launches the candidate really made at the test shape (its trial records, which the replay verified)
   (sandbox/inside/compile_child.py);
3. the judge refuses (`compile-target`) a launch that does not compile, spills registers or needs more
   shared memory than the target has, a description it cannot use, and, at the test shape, described
   launches that differ from the real ones (kernel, constexprs, warps, stages).
It is a pre-filter: what passes it still goes through the GPU battery where one exists. The verdict's
`compile` key holds per target one entry per distinct cubin (kernel, registers, spill_bytes, ...).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import CUDA, Device
from kernelloop.kernels.spec import OpSpec, parse_dtype
from kernelloop.kernels.target_compile import TARGETS, CompileResult, parse_targets
from kernelloop.sandbox import wire
from kernelloop.sandbox.judge.children import Child
from kernelloop.sandbox.judge.decisions import label
from kernelloop.sandbox.judge.executables import ptxas
from kernelloop.sandbox.judge.forkserver import ForkServer
from kernelloop.sandbox.messages import Capture, CaptureRequest, Compile, Load, Plan, Record, Trial
from kernelloop.sandbox.verdict import Verdict

MAX_LAUNCHES_PER_SHAPE = 16
_RESULT_INTS = ("registers", "spill_bytes", "stack_bytes", "shared_bytes")


def compile_setup(targets: tuple[str, ...] | str, device: Device, fork_server: bool,
                  server: ForkServer | None) -> tuple[tuple[str, ...], ForkServer | None, tuple[str, ...]]:
    """(targets, fork server for compile processes, executables they may start); nothing without targets.
    Compiling needs compiled Triton: on CPU a second fork server in that mode (started on first use), on
    CUDA the sandbox's own. A bad target or a Triton without ptxas is one KernelloopError line."""
    if not targets:
        return (), None, ()
    names = parse_targets(targets if isinstance(targets, str) else ",".join(targets))
    programs = {ptxas(TARGETS[name]) for name in names}
    if None in programs:
        raise KernelloopError("--compile-for needs Triton's bundled ptxas, which this triton build lacks")
    compiler = (ForkServer(CUDA) if device.interpreted else server) if fork_server else None
    if compiler is not None and compiler is not server:
        compiler._ensure()  # its warm-up (imports) overlaps the first candidate's battery
    return names, compiler, tuple(sorted(programs))


def _result(fields: Any, target: str) -> dict[str, Any]:
    """One compile result from the compile process, checked field by field."""
    if not isinstance(fields, dict) or not isinstance(fields.get("kernel"), str):
        raise wire.ProtocolError("malformed compile result")
    out: dict[str, Any] = {"kernel": fields["kernel"][:100]}
    for key in _RESULT_INTS + ("num_warps", "num_stages"):
        value = fields.get(key)
        if value is not None and (type(value) is not int or not 0 <= value < 1 << 40):
            raise wire.ProtocolError(f"malformed compile result field {key}")
        out[key] = value
    error, constexprs = fields.get("error"), fields.get("constexprs")
    if (error is not None and not isinstance(error, str)) or not isinstance(constexprs, dict):
        raise wire.ProtocolError("malformed compile result")
    out["constexprs"] = {str(k)[:60]: v if v is None or type(v) in (bool, int, float) else str(v)[:100]
                         for k, v in list(constexprs.items())[:64]}
    out["error"] = error[:300] if error else None
    seconds = fields.get("seconds")
    out["seconds"] = float(seconds) if type(seconds) in (int, float) else None
    out["target"] = target
    return out


def _problem(result: dict[str, Any]) -> str | None:
    return CompileResult(result["kernel"], result["target"], {}, result["num_warps"] or 0, result["num_stages"] or 0,
                         **{k: result[k] for k in _RESULT_INTS}, error=result["error"]).problem


def _shown(ident: str) -> str:
    name, constexprs, options = json.loads(ident)
    return f"{name}({', '.join(f'{k}={v}' for k, v in constexprs + options)})"


class CompileCheck:
    """One candidate's compile check. `note` each accepted trial's record, then `run` once."""

    def __init__(self, spec: OpSpec, targets: tuple[str, ...], plan: Plan) -> None:
        self.targets = targets
        cost = lambda s: spec.cost(s, parse_dtype("float32")).bytes  # noqa: E731
        self.test_shape = dict(max(spec.test_shapes, key=cost))
        engine = dict(max(spec.engine_shapes, key=cost))
        dtypes = list(dict.fromkeys(t["dtype"] for t in plan["trials"]))
        self.requests = [CaptureRequest(shape=s, dtype=d) for d in dtypes for s in (self.test_shape, engine)]
        self.recorded: dict[str, list[dict[str, Any]]] = {}  # dtype -> launches made at the test shape

    def note(self, trial: Trial, record: Record) -> None:
        if self.targets and trial["shape"] == self.test_shape and not trial["variant"] and trial["dtype"] not in self.recorded:
            entries = record.get("entries") if isinstance(record.get("entries"), list) else []
            self.recorded[trial["dtype"]] = [{k: e.get(k) for k in ("kernel", "args", "kwargs")} for e in entries
                                             if isinstance(e, dict) and e.get("kind") == "launch"]

    def _groups(self, v: Verdict, runner: Child) -> list[tuple[str, list]] | None:
        """(label, launch descriptions) to compile: described and, at the test shape, really made."""
        runner.send(Capture(type="capture", requests=self.requests))
        answer = runner.expect("captured", 1 << 22)
        violations, shapes = answer.get("violations"), answer.get("shapes")
        if isinstance(violations, list) and violations:
            v.fail("sandbox-violation", f"while describing its launches: {str(violations[0])[:300]}")
            return None
        if not isinstance(shapes, list) or len(shapes) != len(self.requests) or not all(isinstance(s, dict) for s in shapes):
            raise wire.ProtocolError("malformed capture answer")
        groups = []
        for request, shape in zip(self.requests, shapes):
            where, launches = label(request["shape"], request["dtype"]), shape.get("launches")
            if shape.get("error") is not None:
                v.fail("compile-target", f"{where}: forward raised on meta inputs ({str(shape['error'])[:200]}); its "
                       "launches must follow from shapes, dtypes and strides, not from tensor values")
                return None
            if not isinstance(launches, list) or not 0 < len(launches) <= MAX_LAUNCHES_PER_SHAPE:
                v.fail("compile-target", f"{where}: described {len(launches) if isinstance(launches, list) else 'no'} "
                       f"launches on meta inputs (1 to {MAX_LAUNCHES_PER_SHAPE} expected)")
                return None
            groups.append((f"{where} (described)", launches))
            if request["shape"] == self.test_shape and request["dtype"] in self.recorded:
                groups.append((f"{where} (launched)", self.recorded[request["dtype"]][:MAX_LAUNCHES_PER_SHAPE]))
        return groups

    def run(self, v: Verdict, runner: Child, spawn: Callable[[], tuple[Child, Load]]) -> None:
        """Capture, compile, judge; sets `v.compile`, and fails `v` on the first problem. Nothing without targets."""
        if not self.targets:
            return
        groups = self._groups(v, runner)
        if groups is None:
            return
        compiler, load = spawn()
        if not load.get("ok"):
            v.fail("compile-target", f"its kernels could not be rebuilt in compiled Triton: {str(load.get('error'))[:300]}")
            return
        descriptions = [d for _, launches in groups for d in launches]
        compiler.send(Compile(type="compile", targets=list(self.targets), launches=descriptions))
        answer = compiler.expect("compiled", 1 << 22)
        launches, results = answer.get("launches"), answer.get("results")
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results) \
                or not isinstance(launches, list) or len(launches) != len(descriptions):
            raise wire.ProtocolError("malformed compile answer")
        checked = [[_result(r.get(t), t) for t in self.targets] for r in results]
        labels: list[list[str]] = [[] for _ in results]
        idents: dict[str, set[str]] = {}
        errors = []
        i = 0
        for where, group in groups:
            for _ in group:
                entry = launches[i]
                i += 1
                compiled = entry.get("compiled") if isinstance(entry, dict) else None
                if type(compiled) is not int or not 0 <= compiled < len(results) or not isinstance(entry.get("ident"), str):
                    errors.append(f"{where}: its launch description is unusable: "
                                  f"{str(entry.get('error') if isinstance(entry, dict) else entry)[:300]}")
                    continue
                labels[compiled].append(where)
                idents.setdefault(where, set()).add(entry["ident"])
        v.compile = {t: [{**checked[k][j], "labels": sorted(set(labels[k]))} for k in range(len(results))]
                     for j, t in enumerate(self.targets)}
        if errors:
            v.fail("compile-target", errors[0])
            return
        for where, _ in groups:
            if where.endswith("(launched)"):
                described = idents.get(where.replace("(launched)", "(described)"), set())
                made = idents.get(where, set())
                if described != made:
                    v.fail("compile-target", f"{where.removesuffix(' (launched)')}: the launches it described on meta "
                           f"inputs ({', '.join(map(_shown, sorted(described)))}) are not the ones it made "
                           f"({', '.join(map(_shown, sorted(made)))})")
                    return
        for j in range(len(self.targets)):
            for k, per_target in enumerate(checked):
                problem = _problem(per_target[j])
                if problem:
                    where = labels[k][0].rsplit(" (", 1)[0] if labels[k] else "?"
                    v.fail("compile-target", f"{self.targets[j]}: kernel {per_target[j]['kernel']} {problem} ({where})")
                    return
