"""Putting a selection in the registry: prompts, the baseline kernels judged, the scoped entries committed in one
commit, gated in budget mode (agent/gate.py judge_budget) and rolled back when the gate fails.

`agent quantize` (agent/commands/quantize.py) runs these in order; each piece is usable alone in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelloop.agent.gate import (
    GateResult,
    HasTokenizer,
    alternate_speed,
    chat_ids,
    judge,
    summary,
)
from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.quantize.measure import compare
from kernelloop.common.errors import RegistryError
from kernelloop.common.progress import Progress
from kernelloop.kernels.device import Device, Fingerprint
from kernelloop.kernels.quant import Scheme
from kernelloop.kernels.registry import ANY_BUCKET, Entry, Provenance, Registry
from kernelloop.kernels.registry.entry import sha256_text, utc_now
from kernelloop.profiler.workload import agent_workload

CALIBRATION_SEED, HELD_OUT_SEED, VALIDATION_SEED = 0, 1, 2
PROPOSER = "quantize"


def workload_prompts(engine: HasTokenizer, count: int, seed: int, avoid: list[list[int]] = ()) -> list[list[int]]:
    """`count` prompts of the profiler's agent workload drawn from `seed`, chat-templated as the gate does,
    none equal to one of `avoid` (so calibration, validation and held-out prompts are disjoint)."""
    taken = {tuple(p) for p in avoid}
    out: list[list[int]] = []
    for request in agent_workload(requests=4 * count + 8, seed=seed):
        ids = chat_ids(engine, request.messages)
        if tuple(ids) not in taken:
            taken.add(tuple(ids))
            out.append(ids)
        if len(out) == count:
            break
    return out


def light_gate(kl_budget: float, device: Device) -> GateConfig:
    """The budget gate's settings. CPU (every kernel interpreted, the quantized ones the slowest): two gate prompts
    of 4 tokens, one speed round (reported, not judged), one greedy runaway generation of 8 tokens, invariance
    over 2 tokens in a batch of 2, no task audit. CUDA: the tune loop's gate with the agent-v1 task audit."""
    if not device.interpreted:
        return GateConfig(kl_budget=kl_budget, tasks="agent-v1")
    return GateConfig(kl_budget=kl_budget, prompts=GATE_PROMPTS[:2], max_tokens=4, speed_rounds=1,
                      runaway_tokens=8, runaway_prompts=1, runaway_sampling=(None,), invariance_tokens=2,
                      invariance_batch=2, tasks="off")


@dataclass(frozen=True)
class Judged:
    """A scheme's baseline kernel as the sandbox judged it (the scoped entries' source and verdict)."""

    scheme: Scheme
    source: str
    verdict: Any  # sandbox/verdict.py Verdict


def judge_baselines(schemes: list[Scheme], device: Device, registry: str | None,
                    progress: Progress = lambda message: None) -> dict[str, Judged]:
    """Each scheme's baseline kernel (the text `agent ops --template` starts from) judged once in the sandbox on
    `device`, correctness only, the path `agent check` takes."""
    from kernelloop.agent.render import throttled
    from kernelloop.kernels.ops import baseline_source
    from kernelloop.sandbox import CheckOptions, Sandbox
    from kernelloop.sandbox.verdict import judge_or_refuse

    out: dict[str, Judged] = {}
    with Sandbox(CheckOptions(device=device, registry=registry, timing=False),
                 progress=throttled(progress, prefix="    sandbox: ")) as sandbox:
        for s in schemes:
            progress(f"judging {s.op}'s baseline kernel on {device}")
            source = baseline_source(s.op)
            out[s.name] = Judged(s, source, judge_or_refuse(sandbox, s.op, source, f"{s.op}_kernel.py"))
    return out


def scoped_entries(plan: dict[str, str], judged: dict[str, Judged], fingerprint: Fingerprint, dtype: str) -> list[tuple[Entry, str]]:
    """The selection as registry entries: one per scope, its scheme's op and baseline kernel, every bucket,
    speedup 1.0 (bytes are what they buy; the gate measures the rest)."""
    out = []
    for scope, name in sorted(plan.items()):
        j = judged[name]
        entry = Entry(op=j.scheme.op, device=fingerprint, dtype=dtype, bucket=ANY_BUCKET, sha256=sha256_text(j.source),
                      speedup=1.0, speedup_ci=(1.0, 1.0), provenance=Provenance(PROPOSER),
                      verified_at=utc_now(),
                      batch_invariant=j.verdict.batch_invariant, scope=scope)
        out.append((entry, j.source))
    return out


def commit_selection(registry: Registry, plan: dict[str, str], judged: dict[str, Judged], fingerprint: Fingerprint, dtype: str,
                     budget: float) -> str:
    """One registry commit replacing (fingerprint, dtype)'s scoped entries with the selection; its sha."""
    counts = {name: sum(1 for v in plan.values() if v == name) for name in sorted(set(plan.values()))}
    what = ", ".join(f"{n} {name}" for name, n in counts.items())
    return registry.replace_scoped(fingerprint, dtype, scoped_entries(plan, judged, fingerprint, dtype),
                                   f"quantize: {len(plan)} projections ({what}) under a KL budget of {budget:g} nats")


def gate_summary(ctx: Any, held_out: Any = None) -> dict[str, Any]:
    """The gate's summary of the engine as it serves now (before the commit, and at it), its KL teacher-forced:
    the served engine's distributions along the reference's greedy tokens, on the gate prompts and on the
    selection's held-out prompts (`held_out`, a measure.Calibration: the workload the budget is about, many
    positions for one forward each). From the first token a quantized engine chooses differently its own
    generation continues another text, so a free-running comparison compares different contexts. "kl" is the
    mean over every position, "kl_positions" their count, "forced_agreement" the share of positions whose
    argmax is the reference's. `ctx`: a LoopContext over an in-process engine (LocalEngine)."""
    reference = ctx.measure_reference()
    out = summary(reference, ctx.measure_engine(), long=ctx.long_generations(), invariance=ctx.batch_invariance(),
                  tasks=ctx.task_audit())
    pairs = list(zip(ctx.prompt_ids(), reference.greedy))
    want = ctx.reference.forced_logprobs(pairs)
    if held_out is not None:
        pairs, want = pairs + list(held_out.pairs), want + list(held_out.reference)
    quality = compare(want, ctx.engine.forced_logprobs(pairs))
    out.update(kl=quality.kl, kl_positions=quality.positions, forced_agreement=quality.agreement)
    return out


def gate_commit(ctx: Any, before: dict[str, Any], commit_sha: str, interpreted: bool, held_out: Any = None) -> tuple[GateResult, dict[str, Any]]:
    """Reload at HEAD (the commit), measure, alternate the speed between the commit's parent and the commit,
    and judge in budget mode. Returns the result and the speed rounds."""
    ctx.reload()
    after = gate_summary(ctx, held_out)
    rounds = ctx.gate.speed_rounds
    ctx.progress(f"end-to-end gate: tokens/s before and after, {rounds} alternated round{'s' if rounds != 1 else ''}")
    measure_at = ctx.tokens_per_second_at
    if interpreted:  # reported, never judged: no untimed warm-up run on each side
        measure_at = lambda revision, warmup: ctx.tokens_per_second_at(revision, False)  # noqa: E731
    speed = alternate_speed(measure_at, f"{commit_sha}^", commit_sha, rounds, ctx.progress)
    ctx.reload()  # back to HEAD
    return judge(before, after, speed, ctx.gate, interpreted=interpreted), speed


def record_rollback(history: Any, sha: str, fingerprint: Fingerprint, dtype: str, why: str, ok: bool = True) -> None:
    """The history's "rollback" event for a quantize commit (after its "quantize" and any "gate" event)."""
    history.record_registry_event("rollback", None, commit_sha=sha, device=fingerprint, dtype=dtype, ok=ok,
                                  detail={"why": why, "quantize": True})


def roll_back_unfinished(registry: Registry, history: Any, progress: Progress = lambda message: None) -> list[str]:
    """Roll back each commit an earlier `agent quantize` made and never finished gating (the process was killed
    between its commit and its gate's result: a "quantize" event in status "gating" with no "gate" or "rollback"
    event for its commit). A commit this registry does not hold is left alone; one it cannot roll back (changed
    again since) is recorded as a failed rollback, so it is reported once. Returns the commits rolled back."""
    if registry.head() is None:
        return []
    events = history.registry_events(limit=1000)
    settled = {e["commit_sha"] for e in events if e["kind"] in ("gate", "rollback")}
    pending = [e for e in events if e["kind"] == "quantize" and e["commit_sha"] and e["commit_sha"] not in settled
               and (e["detail"] or {}).get("status") == "gating"]
    done = []
    for event in pending:
        sha, why = event["commit_sha"], "its gate never finished (the agent quantize run that made it was stopped)"
        try:
            registry.commit_of(sha)
        except RegistryError:
            continue  # another registry's commit
        try:
            registry.rollback(sha)
        except RegistryError as exc:
            progress(f"an unfinished quantize commit {sha[:10]} could not be rolled back: {exc}")
            record_rollback(history, sha, event["device"], event["dtype"], f"{why}; not rolled back: {exc}", ok=False)
            continue
        record_rollback(history, sha, event["device"], event["dtype"], why)
        progress(f"rolled back {sha[:10]}: {why}")
        done.append(sha)
    return done
