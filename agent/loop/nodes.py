"""The tune loop's steps. Each takes the checkpointed state and returns the fields it changes.

Every step may run twice (a hard kill after its side effect but before its checkpoint), so each
side effect is looked up before it is repeated: a candidate is recorded once per (run, source
hash), judged once (an existing verdict is reused), committed once (the registry's current entry is
checked), rolled back once.

Every answer a proposer gives becomes a history row with a verdict: a candidate gets the sandbox's; an
unusable answer (a proposer's `rejected`: no code, cut off, unfinished) and a module proposed again in
the same run (duplicate, never judged twice) get a proposal verdict (stage "proposal") at once. All of
them go back to their proposer as feedback. A run whose proposers never produced a candidate ends
"no-candidate", with the cause.
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import replace
from typing import Any

from kernelloop.agent.gate import GateResult, alternate_speed, judge, summary
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.state import TuneSettings, TuneState
from kernelloop.agent.loop.target import choose_target, op_shapes
from kernelloop.agent.loop.winners import winners
from kernelloop.agent.proposers.base import Proposal, TuneContext, check_proposers
from kernelloop.agent.proposers.feedback import PROPOSAL_FAILURES, PROPOSAL_STAGE, proposal_verdict
from kernelloop.kernels.device import device_fingerprint
from kernelloop.kernels.display import storable_text
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry.entry import Provenance, sha256_text
from kernelloop.profiler.workload import agent_workload
from kernelloop.sandbox import CheckOptions
from kernelloop.sandbox.verdict import CORRECT_FAILURES, judge_or_refuse

VERDICT_KEYS = ("correct", "accepted", "speedup", "speedup_interval", "failure", "reason", "stage", "baseline",
                "batch_invariant", "invariance_reason")


# How the cause of a run without a candidate counts each kind of unusable answer (singular, plural).
ANSWER_KINDS = {
    "no-code": ("answer without a code block", "answers without a code block"),
    "cut-off": ("cut off by max_tokens", "cut off by max_tokens"),
    "truncated": ("answer with an unfinished code block", "answers with an unfinished code block"),
    "duplicate": ("repeat of an earlier module", "repeats of an earlier module"),
}
assert set(ANSWER_KINDS) == set(PROPOSAL_FAILURES)


def _trim(verdict: dict[str, Any]) -> dict[str, Any]:
    timing = {k: v for k, v in (verdict.get("timing") or {}).items() if k != "rounds_detail"}
    return {**{k: verdict.get(k) for k in VERDICT_KEYS}, "timing": timing}


def _judged_in_sandbox(entry: dict[str, Any]) -> bool:
    return entry["verdict"].get("stage") != PROPOSAL_STAGE


def _refusals(judged: list[dict[str, Any]]) -> str:
    """Why no candidate won: the refusals by failure code, and the last one's reason."""
    refused = [j["verdict"] for j in judged if _judged_in_sandbox(j)]
    if any(v.get("accepted") for v in refused):  # accepted, but --batch-invariant wanted what none proved
        return f"no accepted candidate was batch invariant ({sum(1 for v in refused if v.get('accepted'))} accepted)"
    if not refused:
        return "no candidate was accepted by the sandbox"
    codes = Counter(v.get("failure") or "refused" for v in refused)
    counts = ", ".join(f"{n} {code}" for code, n in codes.most_common())
    return f"no candidate was accepted by the sandbox ({counts}; last: {refused[-1].get('reason', '')[:200]})"


def _storable(p: Proposal) -> Proposal:
    """The answer as text that hashes, stores and checkpoints (an LLM's JSON may carry lone surrogates)."""
    source, label = storable_text(p.source), storable_text(p.label)
    return p if (source, label) == (p.source, p.label) else replace(p, source=source, label=label)


def _display(name: str) -> str:
    return "LLM" if name == "llm" else name


def no_candidate_reason(name: str, rounds: int, judged: list[dict[str, Any]], error: str | None) -> str:
    """'the LLM proposer produced no candidate in 3 rounds: 2 answers without a code block, 1 cut off by
    max_tokens' (+ '; <the endpoint's last error>')."""
    counts: dict[str, int] = {}
    for j in judged:
        if j["proposer"] == name:
            counts[j["verdict"]["failure"]] = counts.get(j["verdict"]["failure"], 0) + 1
    kinds = [f"{n} {ANSWER_KINDS[f][n != 1] if f in ANSWER_KINDS else f}" for f, n in counts.items()]
    text = (f"the {_display(name)} proposer produced no candidate in {rounds} round{'s' if rounds != 1 else ''}: "
            + (", ".join(kinds) or "no answer"))
    return text + (f"; {error}" if error else "")


class Nodes:
    def __init__(self, ctx: LoopContext, settings: TuneSettings) -> None:
        self.ctx, self.settings = ctx, settings
        self.fingerprint = device_fingerprint(settings.device)

    # -- profile and target ---------------------------------------------------------------------

    def profile(self, state: TuneState) -> dict[str, Any]:
        ctx = self.ctx
        ctx.progress("profiling the engine")
        workload = agent_workload(self.settings.profile_requests, seed=state["run_id"], max_tokens=(4, 8))
        profile = ctx.profile(workload)
        profile_id = ctx.history.record_profile(profile)
        op = state.get("op")
        if not op:
            op, why = choose_target(profile, ctx.history)
            ctx.progress(f"target: {why}")
        dtype, shapes, roofline = op_shapes(profile, op)
        bucket = get_op(op).bucket(shapes[0])
        ctx.progress(f"{op}: tuning {dtype} [{bucket}] ({len(shapes)} shapes seen)")
        return {"op": op, "profile_id": profile_id, "dtype": dtype, "shapes": shapes, "bucket": bucket,
                "roofline": roofline, "round": 0, "pending": [], "judged": [], "status": "running"}

    # -- propose and check ----------------------------------------------------------------------

    def _current_entry(self, state: TuneState):
        return self.ctx.registry.select(state["op"], self.fingerprint, state["dtype"], state["bucket"])

    def propose(self, state: TuneState) -> dict[str, Any]:
        ctx, op = self.ctx, state["op"]
        entry = self._current_entry(state)
        failures = tuple({"source": a.get("source", ""), "failure": a["failure"], "reason": a["reason"]}
                         for a in ctx.history.attempts(op=op, limit=20)
                         if a.get("failure") not in (None, *CORRECT_FAILURES, *PROPOSAL_FAILURES))[:5]
        spec = get_op(op)  # the state holds the op's name (it is checkpointed); the proposers get its spec
        tctx = TuneContext(spec=spec, dtype=state["dtype"], device=self.settings.device, shapes=tuple(state["shapes"]),
                           best_source=ctx.registry.source(entry) if entry else None,
                           baseline_source=inspect.getsource(inspect.getmodule(spec.forward)),
                           roofline=state.get("roofline") or {}, failures=failures,
                           batch_invariant=self.settings.batch_invariant)
        pending: list[dict[str, Any]] = []
        answered: list[dict[str, Any]] = []   # this round's answers that got a proposal verdict
        errors: dict[str, str] = {}
        round_no = state["round"] + 1
        for name, proposer in check_proposers(ctx.proposers).items():
            feedback = [(Proposal(j["source"], j["proposer"], j["label"]), j["verdict"])
                        for j in state["judged"] if j["proposer"] == name]
            for p in proposer.propose(tctx, feedback, self._per_proposer()):
                p = _storable(p)
                sha = sha256_text(p.source)
                cid = ctx.history.find_candidate(state["run_id"], sha)
                first = next((q for q in state["judged"] + pending + answered
                              if cid is not None and q["candidate_id"] == cid), None)
                if first is not None:  # the same module again: recorded, not judged twice
                    answered.append(self._record(state, p, self._duplicate(first)))
                    continue
                cid = cid or self._record_candidate(state, p)
                pending.append({"candidate_id": cid, "sha256": sha, "source": p.source, "proposer": p.proposer,
                                "label": p.label})
            for p, verdict in proposer.rejected:
                answered.append(self._record(state, _storable(p), verdict))
            if proposer.last_error:
                errors[name] = proposer.last_error
                ctx.progress(f"{_display(name)} proposer: {proposer.last_error}")
        for a in answered:
            ctx.progress(f"  {a['label']}: {a['verdict']['failure']}: {a['verdict']['reason']}")
        ctx.progress(f"round {round_no}: {len(pending)} new candidates"
                     + (f", {len(answered)} answers not judged" if answered else ""))
        update: dict[str, Any] = {"pending": pending, "round": round_no, "judged": state["judged"] + answered,
                                  "errors": errors}
        if not pending and not answered:
            why = "; ".join(f"{_display(n)} proposer: {e}" for n, e in errors.items())
            update.update(status="no-winner", reason=why or "the proposers had nothing new to try")
        return update

    def _per_proposer(self) -> int:
        """Candidates asked of each proposer: --candidates; with a pool, as many as it has judges, capped by it."""
        pool = self.ctx.pool
        return self.settings.candidates if pool is None else max(1, min(self.settings.candidates, pool.size))

    def _record_candidate(self, state: TuneState, p: Proposal) -> int:
        return self.ctx.history.record_candidate(
            state["op"], p.source, p.proposer, model=p.model, prompt=p.prompt, tokens_prompt=p.tokens_prompt,
            tokens_completion=p.tokens_completion, run_id=state["run_id"], label=p.label)

    def _duplicate(self, first: dict[str, Any]) -> dict[str, Any]:
        v = first.get("verdict")
        outcome = ("judged in this round" if v is None else
                   f"{'accepted' if v['accepted'] else v['failure']}: {v['reason']}")
        return {**proposal_verdict("duplicate", f"the same module as {first['label']} (candidate "
                                                f"{first['candidate_id']}, {outcome})"),
                "duplicate_of": first["candidate_id"]}

    def _record(self, state: TuneState, p: Proposal, verdict: dict[str, Any]) -> dict[str, Any]:
        """An answer with a proposal verdict: its candidate row (a duplicate points at the first) and verdict."""
        verdict = {"op": state["op"], "device": self.fingerprint, **verdict}
        cid = self.ctx.history.record_candidate(
            state["op"], p.source, p.proposer, model=p.model, prompt=p.prompt, tokens_prompt=p.tokens_prompt,
            tokens_completion=p.tokens_completion, run_id=state["run_id"], parent_id=verdict.get("duplicate_of"),
            label=p.label)
        self.ctx.history.record_verdict(cid, verdict)
        return {"candidate_id": cid, "sha256": sha256_text(p.source), "source": p.source, "proposer": p.proposer,
                "label": p.label, "verdict": _trim(verdict)}

    def _options(self, state: TuneState) -> CheckOptions:
        # The committed entry serves only the profiled dtype (entries are per op, device, dtype,
        # bucket), so the battery checks that dtype: a third of the interpreter's time.
        return CheckOptions(device=self.settings.device, registry=self.ctx.registry.path, dtypes=(state["dtype"],),
                            shapes=tuple(state["shapes"]), timing_shape=state["shapes"][0],
                            timing_dtype=state["dtype"], min_gain=self.settings.min_gain,
                            **({"timeout_s": self.settings.sandbox_timeout_s} if self.settings.sandbox_timeout_s else {}))

    def _previous(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict a candidate already has (judged before a crash: it stands, never judged twice)."""
        verdicts = (self.ctx.history.candidate(item["candidate_id"]) or {}).get("verdicts") or []
        return verdicts[-1] if verdicts else None

    def _judged(self, item: dict[str, Any], verdict: dict[str, Any], show: bool = True) -> dict[str, Any]:
        """The candidate with its trimmed verdict, for the state (and its outcome shown)."""
        trimmed = _trim(verdict)
        if show:
            shown = f"{trimmed['speedup']:.3f}x" if trimmed["speedup"] else "-"
            by = verdict.get("judged_by")
            where = f" (actor {by['actor']} on {by['node']}{', retried' if by.get('retried') else ''})" if by else ""
            self.ctx.progress(f"  {item['label']}: {'ACCEPTED' if trimmed['accepted'] else trimmed['failure']} {shown}{where}")
        return {**item, "verdict": trimmed}

    def check(self, state: TuneState) -> dict[str, Any]:
        if self.ctx.pool is not None:
            return self._check_round(state)
        ctx = self.ctx
        item, rest = state["pending"][0], state["pending"][1:]
        verdict = self._previous(item)
        if verdict is None:
            ctx.progress(f"checking {item['label']}")
            v = judge_or_refuse(ctx.sandbox(self._options(state)), state["op"], item["source"], item["label"])  # recorded, never raised
            verdict = v.to_json()
            ctx.history.record_verdict(item["candidate_id"], verdict)
        return {"pending": rest, "judged": state["judged"] + [self._judged(item, verdict)]}

    def _check_round(self, state: TuneState) -> dict[str, Any]:
        """--cluster: every pending candidate of the round judged at once across the pool's actors, each
        verdict recorded here (the head: one SQLite writer) as it arrives; a candidate that already has a
        verdict (a head killed mid-round) keeps it and is not sent again."""
        from kernelloop.sandbox.cluster import ClusterJob

        ctx, items = self.ctx, state["pending"]
        verdicts = {i: v for i, v in ((i, self._previous(item)) for i, item in enumerate(items)) if v is not None}
        todo = [i for i in range(len(items)) if i not in verdicts]
        if todo:
            options = self._options(state)
            # judged on the device kind the entry will serve (the pool refuses a kind it has no judge for)
            jobs = [ClusterJob(op=state["op"], source=items[i]["source"], label=items[i]["label"], options=options,
                               device_kind=self.fingerprint) for i in todo]
            ctx.progress(f"checking {len(jobs)} candidates on {ctx.pool.size} judges"
                         + (f" ({len(verdicts)} judged before a restart)" if verdicts else ""))

            def record(j: int, v: Any) -> None:
                verdicts[todo[j]] = v.to_json()
                ctx.history.record_verdict(items[todo[j]]["candidate_id"], verdicts[todo[j]])
                self._judged(items[todo[j]], verdicts[todo[j]])  # shown as it arrives

            ctx.pool.judge(jobs, on_verdict=record)
        judged = [self._judged(item, verdicts[i], show=i not in todo) for i, item in enumerate(items)]
        return {"pending": [], "judged": state["judged"] + judged}

    # -- accept: gate, commit, reload, verify ------------------------------------------------------

    def gate_before(self, state: TuneState) -> dict[str, Any]:
        winner = max(winners(state["judged"], self.settings.batch_invariant),
                     key=lambda j: (j["verdict"]["speedup_interval"] or [0])[0])
        ctx = self.ctx
        ctx.progress(f"winner: {winner['label']} ({winner['verdict']['reason']}); measuring the engine before")
        return {"winner": winner,
                "gate_before": summary(ctx.measure_reference(), ctx.measure_engine(), long=ctx.long_generations(),
                                       invariance=ctx.batch_invariance(), tasks=ctx.task_audit())}

    def commit(self, state: TuneState) -> dict[str, Any]:
        ctx, w = self.ctx, state["winner"]
        entry = self._current_entry(state)
        if entry is None or entry.sha256 != w["sha256"] or entry.provenance.history_id != w["candidate_id"]:
            interval = w["verdict"]["speedup_interval"]
            added = ctx.registry.add(
                state["op"], w["source"], device=self.fingerprint, dtype=state["dtype"], bucket=state["bucket"],
                speedup=w["verdict"]["speedup"], speedup_ci=(interval[0], interval[1]),
                provenance=Provenance(w["proposer"], history_id=w["candidate_id"]),
                batch_invariant=w["verdict"].get("batch_invariant"))
            entry, commit_sha = added.entry, added.commit
        else:  # a resumed run that was killed after its commit
            commit_sha = ctx.registry.added_by(entry).sha
        if not any(e["kind"] == "add" and e["entry_id"] == entry.id for e in ctx.history.registry_events(op=state["op"])):
            ctx.history.record_registry_event("add", state["op"], entry_id=entry.id, commit_sha=commit_sha,
                                              device=self.fingerprint, dtype=state["dtype"], bucket=state["bucket"],
                                              speedup=entry.speedup, ok=True)
        ctx.progress(f"committed {entry.id} ({commit_sha and commit_sha[:10]})")
        return {"committed": {"entry_id": entry.id, "commit_sha": commit_sha}}

    def _run_events(self, state: TuneState, entry_id: str) -> dict[str, dict[str, Any]]:
        """This run's registry events for `entry_id`, newest per kind (a resumed step looks here first)."""
        events: dict[str, dict[str, Any]] = {}
        for e in self.ctx.history.registry_events(op=state["op"], limit=500):
            if e["entry_id"] == entry_id and (e.get("detail") or {}).get("run_id") == state["run_id"]:
                events.setdefault(e["kind"], e)
        return events

    def gate_after(self, state: TuneState) -> dict[str, Any]:
        ctx, op, run_id = self.ctx, state["op"], state["run_id"]
        entry_id, commit_sha = state["committed"]["entry_id"], state["committed"]["commit_sha"]
        events = self._run_events(state, entry_id)
        changed = ctx.reload()  # always: a resumed run's engine must serve the commit again
        # The engine the gate measures (a fleet's first, agent/fleet.py), and a fleet's engines reloaded.
        gate_engine = getattr(ctx.engine, "url", "in-process")
        fleet = {"engines": list(ctx.engine.urls)} if hasattr(ctx.engine, "urls") else {}
        if "reload" not in events:
            ctx.history.record_registry_event("reload", op, entry_id=entry_id, ok=True, run_id=run_id,
                                              detail={"changed": {k: {b: list(v) for b, v in c.items()}
                                                                  for k, c in changed.items()}, **fleet})
        if "gate" in events:  # judged before a crash: the result stands
            stored = events["gate"]["detail"]
            result = GateResult(**{k: stored[k] for k in GateResult.__dataclass_fields__ if k in stored})
        else:
            after = summary(ctx.measure_reference(), ctx.measure_engine(), long=ctx.long_generations(),
                            invariance=ctx.batch_invariance(), tasks=ctx.task_audit())
            rounds = ctx.gate.speed_rounds
            ctx.progress(f"end-to-end gate: tokens/s before and after, {rounds} alternated rounds")
            # The registry without the winner is its commit's parent; the two are served alternately.
            speed = alternate_speed(ctx.tokens_per_second_at, f"{commit_sha}^", commit_sha, rounds, ctx.progress)
            ctx.reload()  # back to HEAD, which holds the commit
            result = judge(state["gate_before"], after, speed, ctx.gate, interpreted=ctx.device.interpreted)
            ctx.history.record_registry_event("gate", op, entry_id=entry_id, ok=result.ok, run_id=run_id,
                                              detail={**result.to_json(), "speed": speed, "engine": gate_engine})
        ctx.progress(f"end-to-end gate: {'passed' if result.ok else 'FAILED'}: {result.reason}")
        gate = {**result.to_json(), "engine": gate_engine}
        if result.ok:
            return {"gate": gate, "status": "winner", "reason": state["winner"]["verdict"]["reason"]}
        entry = self._current_entry(state)
        if entry is not None and entry.id == entry_id:
            ctx.registry.rollback(entry.id)
        if "rollback" not in events:
            ctx.history.record_registry_event("rollback", op, entry_id=entry_id, ok=True, run_id=run_id,
                                              detail={"why": result.reason})
        ctx.reload()
        return {"gate": gate, "status": "gate-failed", "reason": f"rolled back: {result.reason}"}

    def finish(self, state: TuneState) -> dict[str, Any]:
        status = state.get("status") or "no-winner"
        if status == "running":
            status = "no-winner"
        judged, errors = state.get("judged", []), state.get("errors") or {}
        reason = state.get("reason") or _refusals(judged)
        empty = [name for name in self.ctx.proposers if not any(
            j["proposer"] == name and _judged_in_sandbox(j) for j in judged)]
        causes = [no_candidate_reason(name, state.get("round", 0), judged, errors.get(name))
                  for name in empty]
        if status == "no-winner" and self.ctx.proposers and len(empty) == len(self.ctx.proposers):
            status, reason = "no-candidate", "; ".join(causes)
        else:
            for cause in causes:
                self.ctx.progress(f"warning: {cause}")
        detail = {"op": state.get("op"), "reason": reason, "committed": state.get("committed"),
                  "candidates": sum(1 for j in judged if _judged_in_sandbox(j)), "answers": len(judged),
                  "rounds": state.get("round", 0), "gate": state.get("gate")}
        self.ctx.history.finish_run(state["run_id"], status, detail)
        return {"status": status, "reason": reason}
