"""The timing phase of a correct candidate: A/B against the baseline, in rounds, every call checked.

`ABTimer` belongs to one `Sandbox` (sandbox/judge/orchestrator.py) and works through what the sandbox
offers every phase: `spawn` (a sandboxed process for the candidate being judged), `checked_call` (call,
judge, replay, judge the replay) and `run`, the candidate's CandidateRun (its budget, deadline, phase
and processes: sandbox/judge/candidate_run.py). The baseline (the registry's current choice for the
device, dtype and bucket, else the op's own kernel) runs in its own runner and replayer, confined like a
candidate, and the candidate's kernels are replayed in a replayer started for timing (the same age as the
baseline's). Timing has the rest of the candidate's budget (sandbox/judge/budget.py); a candidate cut off
here stays correct and is not accepted (`timing-incomplete`). A first look whose median clears the bar
but whose interval does not earns the plan's confirmation rounds when the budget has room for them
(sandbox.judge.decisions.worth_confirming, judge_timing's `first_look`).
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any

from kernelloop.common.progress import Step
from kernelloop.kernels.registry.entry import sha256_text
from kernelloop.kernels.registry.store import Registry
from kernelloop.kernels.roofline import device_rates
from kernelloop.kernels.spec import OpSpec, parse_dtype
from kernelloop.sandbox import wire
from kernelloop.sandbox.judge import decisions as judging
from kernelloop.sandbox.judge.children import Child, Refused
from kernelloop.sandbox.judge.plan import timing_dtype, timing_shape, trial_inputs
from kernelloop.sandbox.messages import Timing
from kernelloop.sandbox.verdict import Verdict

CPU_ROUND_BUDGET_S = 0.1  # CPU: a timing round stops adding calls once each side has this much replay time


def planned_timing(spec: OpSpec, options: Any) -> tuple[dict, str]:
    """(shape, dtype) the plan times a candidate at, as asked (before the CPU cuts it to the
    interpreter's scale): what the registry's bucket is chosen by (sandbox.judge.plan.make_plan)."""
    shape = dict(options.timing_shape) if options.timing_shape else timing_shape(spec, options)
    return shape, timing_dtype(spec, options)


def registry_baseline(spec: OpSpec, options: Any, registry: Registry, fingerprint: str, shape: dict | None = None,
                      dtype: str | None = None) -> tuple[str, str] | None:
    """(source, entry id) of `registry`'s current choice for the device, dtype and the shape's bucket
    (default: `planned_timing`); None when `options.registry_baseline` is off, there is no registry or no
    choice, or the entry's file does not match its hash."""
    if not options.registry_baseline:
        return None
    if not registry.exists():
        return None
    if shape is None or dtype is None:
        shape, dtype = planned_timing(spec, options)
    entry = registry.select(spec.name, fingerprint, dtype, spec.bucket(shape))
    if entry is None:
        return None
    source = registry.source(entry)
    return (source, entry.id) if sha256_text(source) == entry.sha256 else None


def drop_timed_checks(v: Verdict) -> None:
    """The verdict lists the battery's checks, not every timed call's (a timed call that fails the
    candidate returns before this, and its check stays)."""
    v.checks = [c for c in v.checks if not c.name.startswith(("timing round", "confirmation round"))]


class ABTimer:
    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox  # a Sandbox: options, progress, fingerprint, run, spawn, checked_call

    def baseline(self, spec: OpSpec, timing: Timing, v: Verdict) -> tuple[str | None, str]:
        """(source or None for the op's own kernel, label): the baseline given as data
        (`options.baseline`, from a cluster's head), else the registry's current choice for the bucket
        asked for (the CPU may time a smaller shape, sandbox.judge.plan), else the op's own kernel."""
        sandbox = self.sandbox
        found = sandbox.options.baseline or registry_baseline(
            spec, sandbox.options, sandbox.registry, sandbox.fingerprint, timing.get("asked_shape", timing["shape"]),
            timing["dtype"])
        if found is not None:
            v.baseline = f"registry {found[1]}"
            return found
        v.baseline = "the op's baseline kernel"
        return None, "baseline"

    def time_candidate(self, spec: OpSpec, timing: Timing, v: Verdict, work: Path, runner: Child, replayer: Child) -> None:
        run, options = self.sandbox.run, self.sandbox.options
        run.deadline = run.budget.deadline  # what correctness left, at least timing's own share
        for child in run.children:
            child.deadline = run.deadline
        rounds: list[dict[str, list[float]]] = []
        try:
            base_runner, base_replayer, base_label = self.baseline_children(spec, timing, v, work)
            sides = {"baseline": (base_runner, base_replayer), "candidate": (runner, replayer)}
            started = time.monotonic()
            if not self.time_rounds(spec, timing, v, sides, base_label, [[0]] + timing["rounds"], "timing", rounds):
                return
        except wire.ChannelTimeout:
            v.fail("timing-incomplete", run.budget.timing_cut(len(rounds), len(timing["rounds"])))
            v.timing = {"shape": dict(timing["shape"]), "dtype": timing["dtype"], "rounds": len(rounds),
                        "rounds_planned": len(timing["rounds"]), "cut_during": run.phase,
                        "rounds_detail": [{"baseline_s": median(r["baseline"]), "candidate_s": median(r["candidate"])}
                                          for r in rounds]}
            drop_timed_checks(v)
            return
        first_look = 0
        if self.has_time_to_confirm(timing, rounds, started) and judging.worth_confirming(rounds, options.min_gain):
            first_look = len(rounds)
            try:
                if not self.time_rounds(spec, timing, v, sides, base_label, timing["confirm"], "confirmation", rounds):
                    return
            except wire.ChannelTimeout:  # the planned rounds were complete: judge them alone
                del rounds[first_look:]
                first_look = 0
        drop_timed_checks(v)
        mode = "replay, cuda events after an L2 flush" if not options.device.interpreted else \
            "replay, replayer's CPU time (cpu-interpreter)"
        dtype = parse_dtype(timing["dtype"])
        rates = device_rates(options.device, dtype)  # measured once per device, then cached
        judging.judge_timing(v, spec, timing["shape"], dtype, rounds, options.min_gain, rates, mode, first_look)
        if "asked_shape" in timing:
            v.timing["asked_shape"] = timing["asked_shape"]

    def has_time_to_confirm(self, timing: Timing, rounds: list, started: float) -> bool:
        """The plan has confirmation rounds and, at the planned rounds' pace (warm-up included), they
        would end well before the candidate's deadline."""
        if not timing.get("confirm"):
            return False
        now = time.monotonic()
        per_round = (now - started) / (len(rounds) + 1)
        return now + 1.5 * per_round * len(timing["confirm"]) < self.sandbox.run.deadline

    def baseline_children(self, spec: OpSpec, timing: Timing, v: Verdict, work: Path) -> tuple[Child, Child, str]:
        sandbox = self.sandbox
        base_source, base_label = self.baseline(spec, timing, v)
        sandbox.run.phase = "starting the baseline"
        base_runner, load = sandbox.spawn("run", spec, base_source, f"{base_label}.py", work / "base-runner")
        base_replayer, rload = sandbox.spawn("replay", spec, base_source, base_label, work / "base-replayer",
                                             load["constants"])
        if base_source is not None and not (load["ok"] and rload["ok"] and not load["violations"]):
            # A registry entry that no longer loads cannot be the baseline: time against the op's own kernel.
            problem = str(load["violations"] or load["error"] or rload["error"])[:200]
            v.baseline = f"the op's baseline kernel (registry {base_label} did not load: {problem})"
            base_runner, load = sandbox.spawn("run", spec, None, "baseline.py", work / "base-runner-2")
            base_replayer, rload = sandbox.spawn("replay", spec, None, "baseline", work / "base-replayer-2")
        if not (load["ok"] and rload["ok"]):
            raise Refused("crash", f"the timing baseline ({base_label}) did not load: "
                           f"{str(load['error'] or rload['error'])[:200]}")
        base_replayer.cpu_timed = sandbox.options.device.interpreted
        return base_runner, base_replayer, base_label

    def time_rounds(self, spec: OpSpec, timing: Timing, v: Verdict, sides: dict[str, tuple[Child, Child]],
                    base_label: str, seeds_per_round: list[list[int]], stage: str,
                    rounds: list[dict[str, list[float]]]) -> bool:
        """Alternating A/B rounds, a round per seed list, appended to `rounds` as they finish; in the
        "timing" stage the first list ([0]) only warms both replayers (untimed). False when the
        candidate failed a timed call (the verdict says how)."""
        sandbox, run = self.sandbox, self.sandbox.run
        shape, dtype = timing["shape"], timing["dtype"]
        warm = stage == "timing"
        planned = len(seeds_per_round) - warm
        for r, seeds in enumerate(seeds_per_round, start=not warm):
            run.phase = f"{stage} round {r}/{planned}"
            if r:
                left = max(0.0, run.deadline - time.monotonic())
                sandbox.progress(Step(f"{run.phase} ({left:.0f} s of the {run.budget.total_s:g} s budget left)",
                                      f"sandbox {stage}", r, planned, run.deadline))
            order = ["baseline", "candidate"] if r % 2 else ["candidate", "baseline"]
            samples: dict[str, list[float]] = {"baseline": [], "candidate": []}
            for seed in seeds:
                args = trial_inputs(spec, shape, dtype, seed, {})
                expected = spec.reference(*args)
                where = f"{stage} round {r} ({judging.label(shape, dtype)})"
                for side in order:
                    target = v if side == "candidate" else Verdict(op=spec.name, device="", file="", sha256="")
                    seconds = sandbox.checked_call(target, spec, *sides[side], where, args, expected, shape)
                    if side == "baseline" and target.failure:
                        raise Refused("crash", f"the timing baseline ({base_label}) failed: {target.reason}")
                    if seconds is None:
                        return False
                    samples[side].append(seconds)
                if sandbox.options.device.interpreted and min(sum(x) for x in samples.values()) > CPU_ROUND_BUDGET_S:
                    break  # interpreted calls are slow and noisy alike: fewer of them per round, same rounds
            if r:
                rounds.append(samples)
        return True
