"""Judging candidates: the judge's side of the process layout, and the verdicts.

Per candidate, from a pre-warmed fork server (sandbox/judge/forkserver.py), all confined (sandbox/inside/confine.py):
  runner    loads the candidate and calls its `forward` on inputs the judge sends, one call at a
            time, returning the outputs and a record of its aten ops and Triton launches;
  replayer  rebuilds only the candidate's `@triton.jit` kernels from the judge's copy of the source
            and redoes each record on the same inputs: its output must equal the runner's, bit for
            bit (else the result was made outside the kernels, or they are nondeterministic);
and for timing (sandbox/judge/timing.py), a runner and a replayer for the baseline (the registry's
current choice, else the op's baseline kernel), in which no candidate ever ran. Correctness and
timing each have their share of the candidate's budget (sandbox/judge/budget.py).

The judge (this process) owns the plan and its seeds, generates every input, computes every
expected output, holds the clock on CPU (it times the replayer's "go" from outside; on CUDA the
replayer, which runs no candidate Python there, times with events) and decides the verdict. Every
timed call is a checked call: fresh inputs, the candidate's output compared with the reference,
the replay compared with the candidate.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelloop.common.errors import KernelloopError
from kernelloop.common.progress import Progress, Step
from kernelloop.kernels.candidate.canonical import canonical_problem
from kernelloop.kernels.candidate.runtime_purity import IMPURE
from kernelloop.kernels.candidate.source_text import read_source
from kernelloop.kernels.candidate.static_check import static_check
from kernelloop.kernels.compare import Comparison
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.spec import OpSpec
from kernelloop.sandbox import wire
from kernelloop.sandbox.inside.guards import memory_refused
from kernelloop.sandbox.inside.program_order import race_orders, uses_atomics
from kernelloop.sandbox.judge import batch_invariance
from kernelloop.sandbox.judge import decisions as judging
from kernelloop.sandbox.judge.budget import Budget, timeout_s
from kernelloop.sandbox.judge.candidate_run import CandidateRun
from kernelloop.sandbox.judge.children import Child, MemoryExceeded, Refused
from kernelloop.sandbox.judge.compile_check import CompileCheck, compile_setup
from kernelloop.sandbox.judge.executables import allowed_executables
from kernelloop.sandbox.judge.forkserver import ForkServer
from kernelloop.sandbox.judge.plan import harness_memory_mb, make_plan, master_seed, trial_inputs
from kernelloop.sandbox.judge.timing import ABTimer
from kernelloop.sandbox.messages import Job, Load, Plan, Record
from kernelloop.sandbox.options import CheckOptions
from kernelloop.sandbox.verdict import Verdict


class SandboxUnavailable(KernelloopError):
    """The operating system's confinement cannot be set up here (and --unconfined was not given)."""


@dataclass
class _Trial:
    """One call the runner answered and the judge accepted, waiting for its replay."""

    where: str
    phase: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    record: Record
    limit: int
    comparison: Comparison | None
    orders: tuple[int | None, ...] = (None,)  # the programs' orders to replay it in (sandbox/inside/program_order.py)


class Sandbox:
    """Judges candidates for one device with one set of options; reuse it for a batch. With
    `options.compile_for`, every correct candidate must also compile for those GPU targets
    (sandbox/judge/compile_check.py)."""

    def __init__(self, options: CheckOptions, progress: Progress | None = None, registry: Registry | None = None) -> None:
        """`registry`: the caller's Registry object for `options.registry` (whose choice is the timing
        baseline), so that one process holds one; None builds it from the path."""
        self.options = options
        self.registry = registry if registry is not None else Registry(options.registry)
        self.progress = progress or (lambda message: None)
        self.fingerprint = options.device.fingerprint
        self.seed = master_seed(options)
        if not options.unconfined:
            from kernelloop.sandbox.inside.confine import harden_current_process, probe
            from kernelloop.sandbox.judge.cuda_check import check as cuda_check

            reason = probe()
            if reason:
                raise SandboxUnavailable(f"cannot confine candidates on this machine ({reason}); "
                                         "pass --unconfined to judge without OS confinement")
            if not options.device.interpreted and (reason := cuda_check()):
                raise SandboxUnavailable(
                    f"CUDA does not work in a confined process on this machine ({reason}); "
                    "`python -m kernelloop.sandbox.judge.cuda_check --layers` shows which layer breaks it")
            harden_current_process()
        self.server = ForkServer(options.device) if options.fork_server else None
        self.executables = allowed_executables(options.device)
        self.compile_for, self._compiler, self._compile_exec = compile_setup(
            options.compile_for, options.device, options.fork_server, self.server)
        self.run: CandidateRun | None = None  # the candidate being judged (sandbox/judge/candidate_run.py)
        self.timer = ABTimer(self)

    def close(self) -> None:
        for server in {id(s): s for s in (self.server, self._compiler) if s is not None}.values():
            server.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one candidate ------------------------------------------------------------------------

    def judge_source(self, op: str, source: str, filename: str) -> Verdict:
        spec = get_op(op)
        start = time.monotonic()
        v = Verdict(op=op, device=self.fingerprint, file=filename, sha256=_sha256(source))
        # The plan depends on the options only: a bad option (an unknown dtype) is the caller's error.
        atomics = uses_atomics(source)  # replayed in several orders, and in float32 (sandbox/judge/plan.py)
        plan = make_plan(spec, self.options, self.seed ^ int(v.sha256[:15], 16), atomics)
        memory_mb = self.options.memory_mb + harness_memory_mb(spec, plan, self.options.device)
        try:  # any failure of a check on the candidate's text is a verdict, never a raise
            problem = None
            if self.options.static_check:
                result = static_check(source, spec.arg_names)
                problem = (None if result.ok else result.reason) or canonical_problem(source)  # the text that runs
        except (KernelloopError, OSError):
            raise  # the machine's failure, not the candidate's
        except Exception as exc:  # noqa: BLE001
            problem = f"the judge could not check this module ({type(exc).__name__}: {str(exc)[:200]})"
        if problem:
            v.fail("static", problem)
            v.duration_s = round(time.monotonic() - start, 3)
            return v
        v.stage = "load"
        if self.server is not None:  # the fork server's start-up is the judge's time, never the candidate's
            start += self.server.boot()
        work = Path(tempfile.mkdtemp(prefix="kernelloop-sandbox-"))
        budget = Budget(start, timeout_s(self.options), timed=bool(plan["timing"]))
        run = self.run = CandidateRun(budget, memory_mb, budget.correctness_deadline)
        try:
            self._judge(spec, source, filename, plan, v, work, atomics)
        except wire.ChannelTimeout:
            v.fail("timeout", f"{run.budget.correctness_cut()} (during {run.phase})")
        except MemoryExceeded:
            v.fail("memory", f"memory limit of {self.options.memory_mb} MiB (+{run.memory_mb - self.options.memory_mb} "
                   f"MiB for the harness) exceeded (during {run.phase})")
        except wire.ChannelClosed as exc:
            died = getattr(exc, "child", None)
            how = died.death() if died is not None else "it closed its channel"
            v.fail("crash", f"a sandboxed process died during {run.phase} ({how})")
        except wire.ProtocolError as exc:
            v.fail("crash", f"a sandboxed process sent garbage during {run.phase}: {exc}")
        except Refused as exc:
            v.fail(exc.failure, f"during {run.phase}: {exc}")
        except Exception as exc:  # noqa: BLE001  (whatever a sandboxed process made happen: a verdict, never a raise)
            v.fail("crash", f"the judge could not use what a sandboxed process sent during {run.phase} "
                   f"({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            if run.children:
                v.log_tail = run.children[0].log_tail()
            for child in run.children:
                child.close()
            shutil.rmtree(work, ignore_errors=True)
        if v.failure is None and not self.options.timing:
            v.reason = "correct (timing skipped)"
        v.duration_s = round(time.monotonic() - start, 3)
        roles = [(c.role, c.busy_s) for c in run.children]
        v.costs = {"start_s": round(run.start_s, 3),
                   "calls_s": round(sum(b for role, b in roles if role == "run"), 3),
                   "replays_s": round(sum(b for role, b in roles if role == "replay"), 3)}
        return v

    def spawn(self, role: str, spec: OpSpec, source: str | None, filename: str, scratch: Path,
               constants: dict | None = None) -> tuple[Child, Load]:
        """Start a sandboxed process for the candidate being judged; returns it (its `isolation` from "ready")
        and its "load" message."""
        run = self.run
        t0, compiling = time.monotonic(), role == "compile"  # compile processes run compiled Triton ("cuda")
        job = Job(role=role, op=spec.name, device="cuda" if compiling else self.options.device.kind, source=source,
                  filename=filename, constants=constants or {}, memory_mb=run.memory_mb,
                  cpu_seconds=int(run.budget.total_s * 2) + 5, confine=not self.options.unconfined,
                  allow_exec=list(self._compile_exec if compiling else self.executables))
        child = Child(self._compiler if compiling else self.server, job, scratch, run.memory_mb, run.deadline)
        run.children.append(child)
        child.isolation = child.expect("ready")["isolation"]
        load = child.expect("load")
        run.start_s += time.monotonic() - t0
        return child, load

    def _answer(self, v: Verdict, spec: OpSpec, runner: Child, where: str, args: tuple, expected: Any,
                shape: dict[str, int], compare: bool = True) -> _Trial | None:
        """Collect and judge the runner's answer to the call just sent (`compare` False: not its values).
        None after a failure."""
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        want = expected if isinstance(expected, tuple) else (expected,)
        limit = 2 * sum(t.untyped_storage().nbytes() for t in inputs) + 4 * sum(
            e.numel() * e.element_size() for e in want) + (1 << 20)
        outputs, facts, record, after = runner.receive_result(limit)
        comparison = judging.judge_call(v, spec, where, facts, record, outputs, after, inputs, expected,
                                        self.options.device, shape, compare)
        trial = _Trial(where, self.run.phase, inputs, outputs, record, limit, comparison)
        if v.failure is not None:
            judging.add_check(v, where, comparison)
            return None
        return trial

    def _same_again(self, v: Verdict, runner: Child, trial: _Trial, args: tuple) -> bool:
        """Call forward a second time on the same inputs: the bits must not change."""
        second, facts, _, _ = runner.call(args, trial.limit, runner.last_config)  # the same autotune config
        if not judging.runtime_failure(v, facts, trial.where) and not (
                len(second) == len(trial.outputs) and all(judging.same_bits(a, b) for a, b in zip(second, trial.outputs))):
            v.fail("nondeterministic", f"{trial.where}: two calls on the same inputs gave different bits")
        if v.failure is not None:
            judging.add_check(v, trial.where, trial.comparison)
        return v.failure is None

    def _replay_outcome(self, v: Verdict, replayer: Child, trial: _Trial) -> float | None:
        """Collect the replay started for `trial` in its first order, replay it in its other orders, and
        again in grid order if bits differ (judge.next_order), judge the replays, record the trial's
        check. Returns the first replay's seconds, None after a failure."""
        phase, self.run.phase = self.run.phase, trial.phase
        replays: judging.Replays = []
        after, seconds, order, pending = [], None, trial.orders[0], list(trial.orders[1:])
        while True:
            got, after, took, done = replayer.finish_replay(trial.limit)
            seconds = took if seconds is None else seconds
            if judging.runtime_failure(v, {"violations": done["violations"], "error": None}, trial.where):
                break
            if done["error"]:
                error = str(done["error"])
                code, text = judging.bounds_code(error, "memory" if memory_refused(error) else "untraceable")
                v.fail(code, f"{trial.where}: the replay of its launches failed: {text[:300]}")
                break
            replays.append((order, got))
            order = judging.next_order(trial.outputs, replays, pending)
            if order == judging.DECIDED:
                break
            replayer.start_replay(trial.record, trial.inputs, order)
        if v.failure is None:
            judging.judge_replays(v, trial.where, trial.outputs, replays, trial.inputs, after, self.options.device)
        judging.add_check(v, trial.where, trial.comparison)
        self.run.phase = phase
        return seconds if v.failure is None else None

    def checked_call(self, v: Verdict, spec: OpSpec, runner: Child, replayer: Child, where: str,
                      args: tuple, expected: Any, shape: dict[str, int]) -> float | None:
        """Call, judge, replay, judge the replay, one after the other (timing: nothing else runs meanwhile).
        Returns the replay's seconds, None after a failure."""
        runner.send_call(args)
        trial = self._answer(v, spec, runner, where, args, expected, shape)
        if trial is None:
            return None
        replayer.start_replay(trial.record, trial.inputs)
        return self._replay_outcome(v, replayer, trial)

    def _judge(self, spec: OpSpec, source: str, filename: str, plan: Plan, v: Verdict, work: Path,
               atomics: bool) -> None:
        runner, load = self.spawn("run", spec, source, filename, work / "runner")
        v.isolation = runner.isolation
        if load["violations"]:
            v.fail("sandbox-violation", f"while importing: {str(load['violations'][0])[:300]}")
        elif not load["ok"] and IMPURE in str(load["error"]):  # module-level state that cannot be frozen
            v.fail("impure", f"while importing: {str(load['error']).split(IMPURE, 1)[1][:300]}")
        elif not load["ok"] and memory_refused(str(load["error"])):  # an allocation the limit refused
            v.fail("memory", f"importing the candidate ran out of its memory limit: {str(load['error'])[:300]}")
        elif not load["ok"]:
            v.fail("load", f"importing the candidate failed: {str(load['error'])[:300]}")
        if v.failure:
            return
        replayer = self._replayer(v, spec, source, filename, work / "replayer", load["constants"])
        if replayer is None:
            return
        v.stage = "correctness"
        check = CompileCheck(spec, self.compile_for, plan)  # does nothing without --compile-for
        # Pipelined: trial i is replayed while the runner computes trial i+1 (and the judge its reference).
        trials, pending = plan["trials"], None
        # Autotuned kernels: trial i pins config slot base + i, so the battery goes round every config from
        # an offset the candidate cannot know; timing (no slot) uses the device's own choice, as the engine.
        base = trials[0]["seed"] % 65521 if trials else 0
        for i, trial in enumerate(trials):
            where = judging.label(trial["shape"], trial["dtype"], trial["variant"]) + (
                " (race check)" if trial.get("race_only") else "")
            self.run.phase = f"trial {i + 1}/{len(trials)} ({where})"
            self.progress(Step(self.run.phase, "sandbox battery", i + 1, len(trials), self.run.deadline, where))
            args = trial_inputs(spec, trial["shape"], trial["dtype"], trial["seed"], trial["variant"])
            runner.send_call(args, config=base + i)
            expected = spec.reference(*args)
            if pending is not None and self._replay_outcome(v, replayer, pending) is None:
                return
            pending = self._answer(v, spec, runner, where, args, expected, trial["shape"], not trial.get("race_only"))
            if pending is None:
                return
            check.note(trial, pending.record)
            pending.orders = race_orders(trial["seed"], atomics)
            replayer.start_replay(pending.record, pending.inputs, pending.orders[0])
            if trial["determinism"] and not self._same_again(v, runner, pending, args):
                return
        if pending is not None and self._replay_outcome(v, replayer, pending) is None:
            return
        v.correct = True
        self.run.phase = f"the compile check for {','.join(self.compile_for)}"
        check.run(v, runner, lambda: self.spawn("compile", spec, source, filename, work / "compiler", load["constants"]))
        if v.failure is not None:
            return
        if self.options.batch_invariance:
            self.run.phase = "the batch invariance probe"
            self._probe_invariance(v, spec, runner, (trials[0]["seed"] if trials else self.seed) ^ 0x5EED)
            if v.failure is not None:
                return
        if plan["timing"]:
            v.stage = "timing"
            # Timed in a fresh replayer, as the baseline is: a process that replayed the whole battery runs
            # the same kernels a few percent faster than a new one (bench/judge_aa.py).
            replayer.close()
            replayer = self._replayer(v, spec, source, filename, work / "timing-replayer", load["constants"])
            if replayer is None:
                return
            replayer.cpu_timed = self.options.device.interpreted
            self.timer.time_candidate(spec, plan["timing"], v, work, runner, replayer)
            if v.failure == "timing-incomplete":
                return  # stopped while timing
        v.stage = "done"

    def _replayer(self, v: Verdict, spec: OpSpec, source: str, filename: str, scratch: Path,
                  constants: dict) -> Child | None:
        """A replayer for the candidate's kernels; None (the verdict `untraceable`) when they cannot be rebuilt."""
        replayer, rload = self.spawn("replay", spec, source, filename, scratch, constants)
        if not rload["ok"]:
            v.fail("untraceable", f"its kernels could not be rebuilt for the replay: {str(rload['error'])[:300]}")
            return None
        return replayer

    def _probe_invariance(self, v: Verdict, spec: OpSpec, runner: Child, seed: int) -> None:
        """Record whether the candidate is batch invariant: a property, never a failure by itself. Its calls
        are calls on valid inputs, so an escape or a raise in one fails the candidate as in the battery."""
        class Failed(Exception):
            pass

        def call(*args: Any) -> list[torch.Tensor]:
            size = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))
            outputs, facts, _, _ = runner.call(args, 16 * size + (4 << 20))
            if judging.runtime_failure(v, facts, "the batch invariance probe"):
                raise Failed
            return outputs

        try:
            v.batch_invariant, v.invariance_reason = batch_invariance.probe(spec, call, self.options.device, seed)
        except Failed:
            pass  # runtime_failure recorded it as the verdict's failure
        except TypeError as exc:  # not tensors: the battery would have refused it; say so, decide nothing
            v.batch_invariant, v.invariance_reason = False, f"the probe's call returned no tensors ({exc})"


def judge_files(op: str, paths: list[Path], options: CheckOptions, progress: Progress | None = None) -> list[Verdict]:
    """One verdict per file, in order, from one sandbox (one fork server)."""
    verdicts = []
    with Sandbox(options, progress) as sandbox:
        for path in paths:
            path = Path(path)
            verdicts.append(sandbox.judge_source(op, read_source(path), str(path)))  # bytes that are not UTF-8 are refused
    return verdicts


def _sha256(source: object) -> str:
    """sha256 of the text as UTF-8; bytes that were not UTF-8 (kept as lone surrogates) count as themselves."""
    text = source if isinstance(source, str) else repr(source)
    try:
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    except UnicodeEncodeError:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
