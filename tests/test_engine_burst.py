"""Serving a burst: the admission window puts a burst spread over a few milliseconds into one
prefill, and mixed steps (a prefill chunk in the same forward as the running decodes) give the same greedy
tokens as separate prefill and decode steps, a long prompt chunked while others decode included."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.loop import EngineLoop
from kernelloop.engine.sampling import SamplingParams
from kernelloop.engine.scheduler import ScheduledBatch, SchedulerConfig

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def recorded(engine: Engine) -> list[ScheduledBatch]:
    """Every batch the engine's scheduler hands out from now on (a snapshot of its rows)."""
    batches: list[ScheduledBatch] = []
    schedule = engine.scheduler.schedule

    def record() -> ScheduledBatch | None:
        batch = schedule()
        if batch is not None:
            batches.append(ScheduledBatch(batch.mode, list(batch.requests), list(batch.starts), list(batch.lengths),
                                          list(batch.samples), batch.num_extend))
        return batch

    engine.scheduler.schedule = record
    return batches


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 900) for _ in range(n)] for n in lengths]


def serve_arrivals(engine: Engine, arrivals: dict[int, list[list[int]]]) -> list[list[int]]:
    """Step the engine, adding arrivals[k] before step k; the greedy tokens of every request, in arrival order."""
    reqs, step = [], 0
    while engine.has_work() or any(k >= step for k in arrivals):
        reqs += [engine.add_request(p, GREEDY) for p in arrivals.get(step, [])]
        if engine.has_work():
            engine.step()
        step += 1
    return [r.output_ids for r in reqs]


def engine_for(mixed: bool, chunk_size: int = 2048) -> Engine:
    return Engine(EngineConfig(scheduler=SchedulerConfig(mixed=mixed, chunk_size=chunk_size, admission_window=0)))


def test_mixed_steps_give_the_tokens_of_separate_prefill_and_decode_steps():
    arrivals = {0: random_prompts([7, 20], 1), 3: random_prompts([33, 3, 11], 2), 6: random_prompts([25], 3)}
    plain = engine_for(False)
    plain_batches = recorded(plain)
    expected = serve_arrivals(plain, arrivals)
    mixed = engine_for(True)
    batches = recorded(mixed)
    assert serve_arrivals(mixed, arrivals) == expected
    assert {b.mode for b in plain_batches} == {"extend", "decode"}
    # the two later arrivals were prefilled alongside the running requests' decodes
    assert [(b.num_extend, len(b.requests)) for b in batches if b.mode == "mixed"] == [(3, 5), (1, 6)]
    assert mixed.allocator.available() + mixed.cache.total_size() == mixed.allocator.num_slots - 1, "slots leaked"


def test_a_long_prompt_is_chunked_while_the_others_keep_decoding():
    arrivals = {0: random_prompts([6, 9], 4), 2: random_prompts([70], 5)}
    plain = engine_for(False, chunk_size=16)
    plain_batches = recorded(plain)
    expected = serve_arrivals(plain, arrivals)
    # control: mixing off, the long prompt's chunks run alone and the running requests wait for them
    assert [b.lengths for b in plain_batches if b.mode == "extend"][1:] == [[16]] * 4 + [[6]]
    assert "mixed" not in {b.mode for b in plain_batches}
    engine = engine_for(True, chunk_size=16)
    batches = recorded(engine)
    assert serve_arrivals(engine, arrivals) == expected
    long = [b for b in batches if b.mode == "mixed"]
    # 16 tokens a step: 14 of the long prompt and one for each running request, which decodes every step
    assert [b.lengths for b in long] == [[14, 1, 1]] * 5
    assert long[-1].samples[0] is True and not any(b.samples[0] for b in long[:-1])
    assert all(b.mode == "decode" for b in batches[2:] if b not in long)


def test_retraction_in_mixed_mode_keeps_results():
    per_slot = 2 * 3 * 2 * 32 * 4  # K and V, 3 layers, 2 kv heads, head_dim 32, float32 (the embedded model)
    config = EngineConfig(kv_cache_bytes=per_slot * 110, scheduler=SchedulerConfig(mixed=True, admission_window=0))
    arrivals = {0: random_prompts([20, 18, 15], 6), 4: random_prompts([22, 19, 17], 7)}
    expected = serve_arrivals(engine_for(False), arrivals)
    engine = Engine(config)
    batches = recorded(engine)
    assert serve_arrivals(engine, arrivals) == expected
    assert any(b.mode == "mixed" for b in batches)
    assert sum(r.retractions for b in batches for r in b.requests) > 0, "the budget was meant to force retraction"
    assert engine.allocator.available() + engine.cache.total_size() == engine.allocator.num_slots - 1, "slots leaked"


@pytest.mark.parametrize("window", [0.25, 0.0])
def test_the_admission_window_puts_a_burst_into_one_prefill(window):
    # the gap as long as the window: the step waits for the whole window (the arrivals are 10 ms apart)
    engine = Engine(EngineConfig(scheduler=SchedulerConfig(admission_window=window, admission_gap=window)))
    batches = recorded(engine)
    loop = EngineLoop(engine).start()
    prompts = random_prompts([12, 30, 5, 18], 8)

    async def burst() -> None:
        queues = []
        for i, p in enumerate(prompts):
            if i:
                await asyncio.sleep(0.1 if window == 0 else 0.01)  # control: gaps longer than a step's pickup
            queues.append((await loop.submit(p, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)))[1])
        for q in queues:
            while not (await q.get()).finished:
                pass

    try:
        asyncio.run(burst())
    finally:
        loop.stop()
    first = batches[0]
    if window:
        assert first.mode == "extend" and len(first.requests) == 4
    else:
        assert len(first.requests) == 1


def first_batch_and_wait(window: float, gap: float, scenario, all_added: bool = True) -> tuple[ScheduledBatch, float]:
    """Run `scenario(loop, params)` (a coroutine function returning the queues to drain, and the moment
    the first request was submitted) against a serving loop; the first batch and how long the first
    submitted request waited for its first token."""
    engine = Engine(EngineConfig(scheduler=SchedulerConfig(admission_window=window, admission_gap=gap)))
    batches = recorded(engine)
    loop = EngineLoop(engine).start()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)

    async def run() -> float:
        queues, submitted = await scenario(loop, params)
        first = await queues[0].get()
        waited = time.perf_counter() - submitted
        for q, out in [(queues[0], first)] + [(q, None) for q in queues[1:]]:
            while not (out or await q.get()).finished:
                out = None
        return waited

    try:
        waited = asyncio.run(run())
    finally:
        loop.stop()
    assert loop.open_arrivals == 0 or not all_added
    return batches[0], waited


@pytest.mark.parametrize("gap", [0.01, 1.0])
def test_a_lone_request_waits_only_the_gap_not_the_window(gap):
    async def lone(loop, params):
        submitted = time.perf_counter()
        return [(await loop.submit(random_prompts([9], 1)[0], params))[1]], submitted

    _, waited = first_batch_and_wait(1.0, gap, lone)
    if gap < 1.0:
        assert waited < 0.8  # the gap and a tiny prefill; the margin is for a busy machine
    else:  # control: a gap as long as the window holds the lone request for the whole window
        assert waited >= 1.0


@pytest.mark.parametrize("reading", [True, False])
def test_a_request_still_being_read_holds_the_step_past_the_gap(reading):
    a, b = random_prompts([7, 11], 2)

    async def one_being_read(loop, params):
        submitted = time.perf_counter()
        with loop.arriving() if reading else contextlib.nullcontext() as arrival:
            queues = [(await loop.submit(b, params))[1]]
            await asyncio.sleep(0.3)  # thirty gaps: only the open arrival can keep the step waiting
            queues.append((await loop.submit(a, params, arrival=arrival))[1])
        return queues, submitted

    first, _ = first_batch_and_wait(1.0, 0.01, one_being_read)
    assert len(first.requests) == (2 if reading else 1)


def test_an_arrival_that_never_comes_holds_the_step_no_longer_than_the_window():
    async def never_added(loop, params):
        submitted = time.perf_counter()
        reading = loop.arriving()  # read, never submitted (as a request the server ends up refusing)
        reading.__enter__()
        queue = (await loop.submit(random_prompts([5], 3)[0], params))[1]
        asyncio.get_running_loop().call_later(1.0, reading.__exit__, None, None, None)
        return [queue], submitted

    _, waited = first_batch_and_wait(0.15, 0.01, never_added, all_added=False)
    assert 0.15 <= waited < 0.9  # held by the window, not until the arrival closes at 1 s


def test_a_refused_request_closes_its_arrival():
    import httpx

    from tests.serving import serve

    engine = Engine(EngineConfig())
    with serve(engine, "m") as (base, loop):
        bad = httpx.post(f"{base}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        wrong = httpx.post(f"{base}/v1/completions", json={"model": "m", "prompt": [10**9], "max_tokens": 2})
        good = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "max_tokens": 2,
                                                               "messages": [{"role": "user", "content": "hi"}]})
        assert (bad.status_code, wrong.status_code, good.status_code) == (400, 400, 200)
        assert loop.open_arrivals == 0


def test_arrivals_aborted_while_held_leave_the_loop_serving():
    engine = Engine(EngineConfig(scheduler=SchedulerConfig(admission_window=1.0, admission_gap=0.5)))
    loop = EngineLoop(engine).start()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)

    async def run() -> bool:
        rid, _ = await loop.submit(random_prompts([6], 4)[0], params)
        await asyncio.sleep(0.05)  # held: its burst might go on for another 0.45 s
        loop.abort(rid)  # the only fresh arrival is gone while the step waits for more
        await asyncio.sleep(0.05)
        queue = (await loop.submit(random_prompts([8], 5)[0], params))[1]
        while not (await queue.get()).finished:
            pass
        return True

    try:
        assert asyncio.run(asyncio.wait_for(run(), 20))  # a dead loop thread answers nothing
    finally:
        loop.stop()
    assert loop.error is None and loop.open_arrivals == 0
