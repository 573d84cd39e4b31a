"""The n-gram repetition detector (agent/runaway.py)."""

from __future__ import annotations

import random

import pytest

from kernelloop.agent.runaway import MIN_REPEATS, NO_LOOP, longest_loop, new_loops


def test_a_token_repeated_is_a_loop_of_period_one() -> None:
    loop = longest_loop([5, 6, 7] + [9] * 20 + [1])
    assert (loop.period, loop.repeats, loop.start, loop.tokens) == (1, 20, 3, (9,))


@pytest.mark.parametrize("period", [2, 3, 5, 8])
def test_a_phrase_repeated_is_found_with_its_period_and_start(period: int) -> None:
    phrase = list(range(100, 100 + period))
    tokens = [1, 2, 3, 4] + phrase * 15 + phrase[:period - 1]  # a partial last repeat does not count
    loop = longest_loop(tokens)
    assert (loop.period, loop.repeats, loop.start, loop.tokens) == (period, 15, 4, tuple(phrase))


def test_ordinary_text_has_no_long_loop() -> None:
    rng = random.Random(3)
    text = [rng.randrange(50_000) for _ in range(400)]
    assert longest_loop(text).repeats == 1
    assert longest_loop([]) == NO_LOOP
    assert longest_loop([4, 4]).repeats == 2


def test_a_period_longer_than_the_limit_is_not_a_loop() -> None:
    phrase = list(range(10))
    assert longest_loop(phrase * 20).repeats < 3  # period 10 > MAX_PERIOD (8)
    assert longest_loop(phrase * 20, max_period=10).repeats == 20


def test_only_a_loop_the_before_side_does_not_reach_is_a_runaway() -> None:
    rng = random.Random(5)
    text = [rng.randrange(1000) for _ in range(300)]
    looping = text[:100] + [7, 8] * 100
    rows = new_loops([text, looping, text], [looping, looping, text[:120] + [3] * (MIN_REPEATS - 1)],
                     ["prompt 0, greedy", "prompt 1, greedy", "prompt 2, seed 1"])
    assert [r.runaway for r in rows] == [True, False, False]
    assert rows[0].after.tokens == (7, 8) and rows[0].after.start == 100
    assert rows[0].describe() == (f"prompt 0, greedy: tokens [7, 8] repeated 100 times from position 100 "
                                  f"(before: at most {rows[0].before.repeats} repeats)")
    assert rows[0].before.repeats < MIN_REPEATS
    assert rows[0].to_json()["after"]["tokens"] == [7, 8]
    with pytest.raises(ValueError):
        new_loops([text], [], ["greedy"])
