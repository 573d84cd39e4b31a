"""The shadow auditor: re-scores what a serving engine actually served, per registry commit, and rolls back
a commit whose audited window breaches a threshold.

`Auditor.poll()` reads the engine's new audit samples (`GET /audit/samples?since=cursor`; the cursor is
the history's: the next seq after the last sample recorded from that engine queue instance, so a restarted
auditor resumes and a restarted engine, a new instance, starts from 0), scores each against the float32
reference by teacher forcing (agent/shadow_audit.py), records every score in the history, and judges each
commit it saw over its last `window` samples. A breach on the commit the registry serves now (HEAD) rolls
it back exactly as `agent registry rollback <commit>` does (a revert commit), asks the engine to reload,
and records a `rollback` registry event whose detail names the audited commit and the reason. The figures
(and any rollback) are posted to `POST /audit/results` for the engine's /metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import httpx

from kernelloop.agent.remote import RemoteEngine
from kernelloop.agent.shadow_audit import AuditConfig, breach, figures, score_sample
from kernelloop.common.errors import KernelloopError, RegistryError
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

log = logging.getLogger("kernelloop.audit")

MAX_PAGES = 4  # samples pages read per poll (64 each): a backlog is caught up over several polls


class AuditSource(Protocol):
    url: str

    def audit_samples(self, since: int) -> dict[str, Any]: ...

    def post_audit_results(self, body: dict[str, Any]) -> None: ...

    def reload(self, revision: str | None = None) -> dict[str, Any]: ...


class Reference(Protocol):
    """agent/local_engine.py LocalEngine: a float32 reference-kernel engine in this process."""

    tokenizer: Any

    def served_logprobs(self, prompt_ids: list[int], served_ids: list[int]) -> Any: ...


class EngineAudit(RemoteEngine):
    """A running engine's audit routes (and its kernel reload)."""

    def audit_samples(self, since: int) -> dict[str, Any]:
        try:
            response = httpx.get(f"{self.url}/audit/samples", params={"since": since}, timeout=self.timeout_s)
            reply = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise KernelloopError(f"{self.url}/audit/samples failed: {exc}") from None
        if not response.is_success or not isinstance(reply, dict) or "instance" not in reply:
            raise KernelloopError(f"{self.url}/audit/samples failed: HTTP {response.status_code} "
                                  "(an engine without the shadow audit?)")
        return reply

    def post_audit_results(self, body: dict[str, Any]) -> None:
        self._post("/audit/results", body)


@dataclass
class PollResult:
    scored: int = 0
    missed: int = 0
    skipped: int = 0  # samples the reference could not score (too long, unknown ids)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # commit -> figures over its window
    rolled_back: list[dict[str, Any]] = field(default_factory=list)   # {commit, revert, reason}


class Auditor:
    def __init__(self, source: AuditSource, reference: Reference, registry: Registry, history: History,
                 config: AuditConfig | None = None, reload: Callable[[], Any] | None = None) -> None:
        """`reload`: what reloads the engines after a rollback (default: the audited engine's reload; the
        daemon of a fleet passes the fleet's, agent/fleet.py, so every engine stops serving the commit)."""
        self.source, self.reference, self.registry, self.history = source, reference, registry, history
        self.config = config or AuditConfig()
        self.reload = reload or source.reload
        self._instance: str | None = None

    def _read(self) -> tuple[dict[str, Any], int]:
        since = self.history.audit_cursor(self._instance) if self._instance else 0
        reply = self.source.audit_samples(since)
        if reply["instance"] != self._instance:
            self._instance = reply["instance"]
            resume = self.history.audit_cursor(self._instance)
            if resume != since:
                since, reply = resume, self.source.audit_samples(resume)
        if since > reply["latest"]:  # a cursor the engine never reached: it restarted
            log.info("engine %s restarted its audit queue; reading from 0", self.source.url)
            since, reply = 0, self.source.audit_samples(0)
        return reply, since

    def poll(self) -> PollResult:
        """Score what the engine sampled since the last poll, judge the commits seen, roll back a breach."""
        result, commits = PollResult(), set()
        reply, _ = self._read()
        for page in range(MAX_PAGES):
            result.missed += int(reply.get("missed") or 0)
            for sample in reply["samples"]:
                if self._score(sample, reply["instance"]):
                    result.scored += 1
                    commits.add(sample.get("commit") or "")
                else:
                    result.skipped += 1
            if not reply["samples"] or reply["next"] >= reply["latest"] or page == MAX_PAGES - 1:
                break
            reply = self.source.audit_samples(reply["next"])
        for commit in sorted(commits):
            fig = figures(self.history.audit_samples(commit, limit=self.config.window))
            result.figures[commit or "none"] = fig
            reason = breach(fig, self.config)
            if reason and commit:
                rolled = self._roll_back(commit, reason, fig)
                if rolled is not None:
                    result.rolled_back.append(rolled)
        if result.figures or result.rolled_back:
            self.source.post_audit_results({"commits": result.figures, "rolled_back": result.rolled_back})
        return result

    def _score(self, sample: dict[str, Any], instance: str) -> bool:
        try:
            reference = self.reference.served_logprobs(sample["prompt_ids"], sample["served_ids"])
        except ValueError as exc:
            log.warning("audit sample %s skipped: %s", sample.get("request_id"), exc)
            reference = None
        text = None
        if reference is not None and sample.get("json_asked"):
            text = self.reference.tokenizer.decode(sample["served_ids"], skip_special_tokens=True)
        score = score_sample(sample, reference, text) if reference is not None else None
        self.history.record_audit_sample(
            sample.get("commit"), score.to_json() if score else {}, engine=self.source.url, instance=instance,
            seq=sample["seq"], request_id=sample.get("request_id"), tokens=len(sample["served_ids"]),
            finished_at=sample.get("finished_at"))
        return score is not None

    def _roll_back(self, commit: str, reason: str, fig: dict[str, Any]) -> dict[str, Any] | None:
        """Roll back `commit` if the registry still serves it (HEAD); None when it no longer does."""
        if self.registry.head() != commit:
            return None  # already rolled back, or a later commit serves now: judged by its own samples
        ops = self._ops_changed(commit)
        revert = self.registry.rollback(commit)
        log.warning("shadow audit rolled back %s (%s): %s", commit[:10], ", ".join(ops) or "?", reason)
        self.history.record_registry_event(  # recorded before the reload, which may take long or fail
            "rollback", ops[0] if len(ops) == 1 else None, commit_sha=revert.sha, ok=True,
            detail={"by": "shadow audit", "audited_commit": commit, "reason": reason, "figures": fig, "ops": ops})
        try:
            self.reload()
        except KernelloopError as exc:  # the revert stands; the engine picks it up at its next reload
            log.error("engine reload after the audit rollback failed: %s", exc)
        return {"commit": commit, "revert": revert.sha, "reason": reason}

    def _ops_changed(self, commit: str) -> list[str]:
        try:
            before = {e.key: e for e in self.registry.entries(f"{commit}~1")}
            after = {e.key: e for e in self.registry.entries(commit)}
        except RegistryError:
            return []
        return sorted({key[0] for key in set(before) | set(after) if before.get(key) != after.get(key)})
