"""Scoring served requests against the float32 reference, and judging a registry commit by its window.

A sample is one finished request as the engine served it (engine/audit_queue.py, as JSON). Scored
against the reference's teacher-forced log-distributions (engine/teacher_force.py):

- agreement: share of served tokens that are the reference's argmax (greedy requests only: a sampled
  token is not meant to be the argmax);
- kl: mean per-token KL(served || reference) over the served top-k plus one bucket for the rest of the
  mass (`coarse_kl`; only when the request asked for logprobs, the only time the engine keeps them);
- loop: the served tokens repeat a short sequence back to back (agent/runaway.py);
- json_valid: the text parses as a JSON object or array (only when the request asked for JSON).

`figures(scores)` averages the last `window` scores of one commit; `breach(figures, config)` names the
first threshold crossed, or None. Too few samples never breach.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from kernelloop.agent.runaway import MIN_REPEATS, longest_loop


@dataclass(frozen=True)
class AuditConfig:
    window: int = 20             # the last this many samples of a commit are judged together
    min_samples: int = 5         # fewer samples of a commit are never judged
    min_agreement: float = 0.9   # greedy tokens that match the reference's argmax, mean over samples
    max_kl: float = 0.05         # nats per token, mean over samples that carried logprobs
    max_loop_rate: float = 0.5   # share of samples whose output loops
    min_json_valid: float = 0.5  # share of JSON-asking samples whose output parses


@dataclass(frozen=True)
class Score:
    agreement: float | None
    kl: float | None
    loop: bool
    json_asked: bool
    json_valid: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"agreement": self.agreement, "kl": self.kl, "loop": self.loop, "json_asked": self.json_asked,
                "json_valid": self.json_valid}


def coarse_kl(served_top: Sequence[Sequence[float]], reference: Mapping[int, float] | Any) -> float:
    """KL(served || reference) at one position from the served top-k [[token id, logprob], ...], the
    rest of each side's mass lumped into one bucket. `reference[id]` is the reference logprob of id."""
    if not served_top:
        return 0.0
    kl, p_rest, q_rest = 0.0, 1.0, 1.0
    for token, lp in served_top:
        p, q = math.exp(lp), math.exp(float(reference[int(token)]))
        p_rest, q_rest = p_rest - p, q_rest - q
        kl += p * (lp - math.log(max(q, 1e-30)))
    p_rest, q_rest = max(p_rest, 0.0), max(q_rest, 1e-30)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0)


def json_valid(text: str) -> bool:
    """Whether `text` (outer whitespace and a ```json fence allowed) is a JSON object or array."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    try:
        return isinstance(json.loads(body), (dict, list))
    except (ValueError, RecursionError):
        return False


def score_sample(sample: Mapping[str, Any], reference: Any, text: str | None = None) -> Score:
    """Score one sample against `reference`, an engine/teacher_force.py TeacherForced for its served
    tokens; `text` is the served text (needed only when the request asked for JSON)."""
    served = list(sample["served_ids"])
    agreement = None
    if sample.get("greedy") and served:
        greedy = reference.greedy
        agreement = sum(a == b for a, b in zip(greedy, served)) / len(served)
    kl = None
    logprobs = sample.get("served_logprobs") or []
    rows = [(i, lp["top"]) for i, lp in enumerate(logprobs) if lp and lp.get("top") and i < len(served)]
    if rows:
        kl = sum(coarse_kl(top, reference.logprobs[i]) for i, top in rows) / len(rows)
    loop = longest_loop(served).repeats >= MIN_REPEATS
    asked = bool(sample.get("json_asked"))
    return Score(agreement, kl, loop, asked, json_valid(text or "") if asked else None)


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def figures(scores: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One commit's figures over `scores` (rows with agreement, kl, loop, json_asked, json_valid)."""
    scores = [s for s in scores if s.get("loop") is not None]  # a sample the reference could not score
    asked = [s for s in scores if s.get("json_asked")]
    return {"samples": len(scores), "agreement": _mean(s.get("agreement") for s in scores),
            "kl": _mean(s.get("kl") for s in scores),
            "loop_rate": sum(bool(s.get("loop")) for s in scores) / len(scores) if scores else None,
            "json_valid": _mean(float(bool(s.get("json_valid"))) for s in asked) if asked else None}


def breach(fig: Mapping[str, Any], config: AuditConfig) -> str | None:
    """The first threshold `fig` crosses, as one line; None when it crosses none or has too few samples."""
    if fig.get("samples", 0) < config.min_samples:
        return None
    n = fig["samples"]
    if fig.get("agreement") is not None and fig["agreement"] < config.min_agreement:
        return f"greedy agreement {fig['agreement']:.3f} < {config.min_agreement} over {n} audited requests"
    if fig.get("kl") is not None and fig["kl"] > config.max_kl:
        return f"KL {fig['kl']:.4f} nats/token > {config.max_kl} over {n} audited requests"
    if fig.get("loop_rate") is not None and fig["loop_rate"] > config.max_loop_rate:
        return f"{fig['loop_rate']:.0%} of {n} audited requests loop (> {config.max_loop_rate:.0%})"
    if fig.get("json_valid") is not None and fig["json_valid"] < config.min_json_valid:
        return f"only {fig['json_valid']:.0%} of JSON-asking requests parse (< {config.min_json_valid:.0%})"
    return None
