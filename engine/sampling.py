"""Per-request sampling parameters with OpenAI-style semantics and validation.

`SamplingParams` is immutable and validated on construction: an invalid value raises
`InvalidSamplingParams` (a `ValueError`) whose message names the field; the server answers it
with HTTP 400. `stop` and `stop_token_ids` are stored as tuples (a single `stop` string is
accepted, as OpenAI does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_LOGPROBS = 20  # OpenAI's limit for top alternatives
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # the range torch.Generator.manual_seed accepts


class InvalidSamplingParams(ValueError):
    """A sampling parameter is out of range or of the wrong type; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"invalid {field}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the tokens of one request.

    max_tokens: tokens to generate at most (>= 1).
    temperature: >= 0; 0 means greedy (argmax, top_k/top_p/seed ignored).
    top_p: nucleus sampling, 0 < p <= 1 (1 = off).
    top_k: -1 (off) or >= 1.
    seed: seeds the request's own generator, so output does not depend on the batch.
    stop: up to 4 non-empty strings; generation ends before the first one (not included).
    stop_token_ids: token ids that end generation (in addition to EOS unless ignore_eos).
    ignore_eos: keep generating after EOS until max_tokens or a stop condition.
    logprobs: None for no logprobs, else how many top alternatives to return (0..20); the
        chosen token's logprob is always returned when not None.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        # Normalise containers to tuples so the frozen object is really immutable (and hashable).
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, Sequence):
            stop = tuple(stop)
        object.__setattr__(self, "stop", stop)
        ids = self.stop_token_ids
        if ids is None:
            ids = ()
        elif isinstance(ids, Sequence) and not isinstance(ids, str):
            ids = tuple(ids)
        object.__setattr__(self, "stop_token_ids", ids)
        self.validate()
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    def validate(self) -> None:
        """Raise InvalidSamplingParams naming the first invalid field."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidSamplingParams("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0:
            raise InvalidSamplingParams("temperature", f"must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if not _is_number(p) or not math.isfinite(p) or not 0 < p <= 1:
            raise InvalidSamplingParams("top_p", f"must be a number in (0, 1], got {p!r}")
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):
            raise InvalidSamplingParams("top_k", f"must be -1 (off) or an integer >= 1, got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not _SEED_MIN <= self.seed <= _SEED_MAX):
            raise InvalidSamplingParams("seed", f"must be null or a 64-bit integer, got {self.seed!r}")
        if not isinstance(self.stop, tuple):
            raise InvalidSamplingParams("stop", f"must be a string or a list of strings, got {self.stop!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidSamplingParams("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidSamplingParams("stop", f"each stop string must be a non-empty string, got {s!r}")
        if not isinstance(self.stop_token_ids, tuple):
            raise InvalidSamplingParams(
                "stop_token_ids", f"must be a list of integers, got {self.stop_token_ids!r}"
            )
        for i in self.stop_token_ids:
            if not _is_int(i) or i < 0:
                raise InvalidSamplingParams("stop_token_ids", f"each id must be an integer >= 0, got {i!r}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams("ignore_eos", f"must be a boolean, got {self.ignore_eos!r}")
        lp = self.logprobs
        if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_LOGPROBS):
            raise InvalidSamplingParams("logprobs", f"must be null or an integer in 0..{MAX_LOGPROBS}, got {lp!r}")

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax (temperature 0)."""
        return self.temperature == 0.0
