"""Runaway detection: a generation that repeats a token or a short token sequence back to back.

A model that starts emitting the same token (or the same few tokens) forever has run away: a race in a
kernel, a norm slightly off, and the sampler falls into a loop the reference model never enters.
`longest_loop(tokens)` finds the n-gram (n <= MAX_PERIOD) repeated back to back the most times in a
row; `new_loops(before, after)` compares two sets of generations of the same prompts and names every
prompt where `after` loops past the threshold while `before` (the reference side) does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MAX_PERIOD = 8     # the longest repeated sequence looked for, in tokens
MIN_REPEATS = 12   # repeats in a row that count as a loop (12 x 1 token, or 12 x a phrase of up to 8)


@dataclass(frozen=True)
class Loop:
    """`period` tokens starting at `start`, repeated `repeats` times in a row."""

    period: int
    repeats: int
    start: int
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": list(self.tokens)}


NO_LOOP = Loop(period=0, repeats=0, start=0, tokens=())


def longest_loop(tokens: list[int], max_period: int = MAX_PERIOD) -> Loop:
    """The back-to-back repetition with the most repeats (the shorter period on a tie; a run of one
    token repeated is period 1, not 2). NO_LOOP for an empty generation."""
    best = NO_LOOP
    for period in range(1, max_period + 1):
        run = 0  # positions i in a row with tokens[i] == tokens[i - period]
        for i in range(period, len(tokens) + 1):
            if i < len(tokens) and tokens[i] == tokens[i - period]:
                run += 1
                continue
            repeats = 1 + run // period
            if repeats > best.repeats and run:
                start = i - run - period
                best = Loop(period, repeats, start, tuple(tokens[start:start + period]))
            run = 0
    if best is NO_LOOP and tokens:
        return Loop(1, 1, 0, (tokens[0],))
    return best


@dataclass(frozen=True)
class PromptLoops:
    """One generation's longest loop before and after (`label`: which prompt, how sampled), and whether
    `after` is a new runaway."""

    label: str
    before: Loop
    after: Loop
    runaway: bool

    def describe(self) -> str:
        a = self.after
        return (f"{self.label}: tokens {list(a.tokens)} repeated {a.repeats} times from position {a.start} "
                f"(before: at most {self.before.repeats} repeats)")

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "before": self.before.to_json(), "after": self.after.to_json(),
                "runaway": self.runaway}


def new_loops(before: list[list[int]], after: list[list[int]], labels: list[str],
              min_repeats: int = MIN_REPEATS) -> list[PromptLoops]:
    """Per generation: `after` runs away when its longest loop reaches `min_repeats` and `before`'s does
    not (a prompt the reference side itself loops on is no evidence against the change)."""
    if not len(before) == len(after) == len(labels):
        raise ValueError("before, after and labels must describe the same generations")
    rows = []
    for b, a, label in zip(before, after, labels):
        lb, la = longest_loop(b), longest_loop(a)
        rows.append(PromptLoops(label, lb, la, runaway=la.repeats >= min_repeats > lb.repeats))
    return rows
