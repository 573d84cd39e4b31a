"""AuditQueue: a ring of finished requests sampled for the shadow audit, and the audit's results.

The server samples a fraction (`--audit-rate`) of finished requests into the ring; the auditor (the
agent's `agent audit` or daemon) reads them with `since(cursor)`, re-scores the served tokens with the
float32 reference and posts its per-commit figures back, which `/metrics` then shows. Sampling is one
seeded draw per finished request and an append: the ring holds at most CAPACITY samples, the oldest
are overwritten (`missed` counts what the auditor never read). Each queue has a random `instance`:
an auditor whose cursor belongs to another instance (the engine restarted) starts again from 0.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from kernelloop.engine.sampler import TokenLogprobs

CAPACITY = 256
AUDIT_TOP = 8  # served top-k alternatives kept per token (when the request asked for logprobs)


@dataclass(frozen=True)
class AuditSample:
    """One finished request as served: what the auditor needs to re-score it."""

    seq: int                         # position in this queue's history (the cursor)
    request_id: str
    prompt_ids: list[int]
    served_ids: list[int]
    served_logprobs: list[dict[str, Any] | None] | None  # per token {token_id, logprob, top: [[id, lp]]}
    commit: str | None               # registry commit serving it (None: no registry commit)
    greedy: bool                     # temperature 0: the served tokens should be the argmax
    json_asked: bool                 # response_format asked for JSON
    finished_at: float               # unix time

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def asks_for_json(request: Any) -> bool:
    """Whether an OpenAI request body asked for JSON output (response_format json_object or json_schema)."""
    fmt = getattr(request, "response_format", None)
    kind = fmt.get("type") if isinstance(fmt, dict) else getattr(fmt, "type", None)
    return kind in ("json_object", "json_schema")


def _wire_logprobs(items: list[TokenLogprobs | None]) -> list[dict[str, Any] | None] | None:
    if not items or all(lp is None for lp in items):
        return None
    return [None if lp is None else {"token_id": lp.token_id, "logprob": lp.logprob,
                                     "top": [[t, p] for t, p in lp.top[:AUDIT_TOP]]} for lp in items]


class AuditQueue:
    """Thread-safe: `add` runs in the server's event loop, `since`/`post_results` in request handlers."""

    def __init__(self, rate: float, capacity: int = CAPACITY, seed: int | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the audit rate must be between 0 and 1, not {rate}")
        self.rate, self.capacity = rate, capacity
        self.instance = uuid.uuid4().hex[:12]
        self._random = random.Random(seed)
        self._ring: deque[AuditSample] = deque(maxlen=capacity)
        self._next = 0  # seq of the next sample added
        self._lock = threading.Lock()
        self.results: dict[str, dict[str, Any]] = {}  # commit -> the auditor's latest figures
        self.rolled_back: list[dict[str, Any]] = []   # what the auditor rolled back, latest last

    def admit(self) -> bool:
        """One seeded draw: whether the request finishing now is sampled."""
        return self.rate > 0 and (self.rate >= 1 or self._random.random() < self.rate)

    def add(self, request_id: str, prompt_ids: list[int], served_ids: list[int],
            logprobs: list[TokenLogprobs | None], commit: str | None, greedy: bool, json_asked: bool) -> AuditSample:
        with self._lock:
            sample = AuditSample(self._next, request_id, list(prompt_ids), list(served_ids), _wire_logprobs(logprobs),
                                 commit, greedy, json_asked, time.time())
            self._ring.append(sample)
            self._next += 1
        return sample

    def since(self, cursor: int) -> tuple[list[AuditSample], int, int, int]:
        """(samples from `cursor` on, the next cursor, how many after `cursor` were overwritten unread,
        latest: the cursor after the newest sample)."""
        with self._lock:
            samples = [s for s in self._ring if s.seq >= cursor]
            oldest = self._ring[0].seq if self._ring else self._next
            missed = max(0, oldest - cursor) if cursor <= self._next else 0
            return samples, self._next, missed, self._next

    def post_results(self, body: dict[str, Any]) -> None:
        """Store the auditor's figures: {"commits": {commit: {samples, agreement, kl, loop_rate, json_valid}},
        "rolled_back": [{commit, reason}]}."""
        with self._lock:
            self.results.update(body.get("commits") or {})
            self.rolled_back.extend(body.get("rolled_back") or [])
            del self.rolled_back[:-16]

    def metrics_lines(self) -> list[str]:
        """Prometheus text lines of the audit gauges."""
        with self._lock:
            queued, taken = len(self._ring), self._next
            results = dict(self.results)
            rolled_back = len(self.rolled_back)
        lines = [f"# TYPE kernelloop_audit_rate gauge\nkernelloop_audit_rate {self.rate}",
                 f"# TYPE kernelloop_audit_samples_queued gauge\nkernelloop_audit_samples_queued {queued}",
                 f"# TYPE kernelloop_audit_samples_total counter\nkernelloop_audit_samples_total {taken}",
                 f"# TYPE kernelloop_audit_rollbacks_total counter\nkernelloop_audit_rollbacks_total {rolled_back}"]
        for name in ("samples", "agreement", "kl", "loop_rate", "json_valid"):
            rows = [(c, f.get(name)) for c, f in sorted(results.items()) if isinstance(f, dict)]
            rows = [(c, v) for c, v in rows if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if rows:
                lines.append(f"# TYPE kernelloop_audit_{name} gauge")
                lines += [f'kernelloop_audit_{name}{{commit="{_label(c)}"}} {v}' for c, v in rows]
        return lines


def _label(value: str) -> str:
    return "".join(ch for ch in str(value)[:40] if ch.isalnum() or ch in "-_.")
