"""EngineLoop's hand-off to the event loop: one wake-up per step, one output for a non-streamed request."""

from __future__ import annotations

import asyncio

import pytest

from kernelloop.engine import loop as loop_module
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.loop import EngineLoop
from kernelloop.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def loop():
    engine_loop = EngineLoop(Engine(EngineConfig())).start()
    yield engine_loop
    engine_loop.stop()


async def _drain(queue: asyncio.Queue) -> list:
    outputs = []
    while not outputs or not outputs[-1].finished:
        outputs.append(await queue.get())
    return outputs


def test_a_non_streamed_request_gets_one_merged_output_equal_to_the_streamed_tokens(loop):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    prompt = loop.engine.tokenizer.encode("the red fox jumps over")

    async def run():
        _, streamed_q = await loop.submit(prompt, params, stream=True)
        streamed = await _drain(streamed_q)
        _, merged_q = await loop.submit(prompt, params, stream=False)
        merged = await _drain(merged_q)
        return streamed, merged

    streamed, merged = asyncio.run(run())
    assert len(streamed) >= 12 and len(merged) == 1
    (one,) = merged
    assert one.finished and one.finish_reason == "length"
    assert one.token_ids == [t for o in streamed for t in o.token_ids]
    assert one.text == "".join(o.text for o in streamed)
    assert len(one.logprobs) == 12


def test_one_event_loop_wake_up_per_step_however_many_requests(loop, monkeypatch):
    calls = []

    async def run():
        aio = asyncio.get_running_loop()
        original = aio.call_soon_threadsafe

        def counting(callback, *args):
            if callback is loop_module._put_all:
                calls.append(len(args[0]))
            return original(callback, *args)

        monkeypatch.setattr(aio, "call_soon_threadsafe", counting)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        prompts = [loop.engine.tokenizer.encode(f"story number {i} begins") for i in range(8)]
        # Added in one command, so all eight are in every step.
        submitted = await loop.call(lambda: [loop.engine.add_request(p, params).rid for p in prompts])
        queues = {}
        for rid in submitted:
            queues[rid] = asyncio.Queue()
            loop._sinks[rid] = (aio, queues[rid])
        return [await _drain(q) for q in queues.values()]

    outputs = asyncio.run(run())
    assert all(sum(len(o.token_ids) for o in outs) == 6 for outs in outputs)
    # Every step hands all eight requests' outputs over in a single call.
    assert calls and max(calls) == 8 and len(calls) <= 7


def test_an_aborted_non_streamed_request_leaves_nothing_behind(loop):
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    async def run():
        rid, _ = await loop.submit(loop.engine.tokenizer.encode("a long story"), params, stream=False)
        loop.abort(rid)
        await loop.call(lambda: None)  # the abort ran
        return rid

    rid = asyncio.run(run())
    assert rid not in loop._held and rid not in loop._sinks and rid not in loop.engine.requests


def test_a_stream_that_fell_behind_gets_the_waiting_outputs_as_one_chunk():
    from kernelloop.engine.engine import StepOutput
    from kernelloop.engine.loop import next_output

    async def run():
        queue: asyncio.Queue = asyncio.Queue()
        for i, last in ((1, False), (2, False), (3, True), (9, False)):
            queue.put_nowait(StepOutput("r", [i], f"t{i}", [None], last, "stop" if last else None))
        merged = await next_output(queue)
        return merged, queue.qsize()

    merged, left = asyncio.run(run())
    assert (merged.token_ids, merged.text, merged.finished, merged.finish_reason) == ([1, 2, 3], "t1t2t3", True, "stop")
    assert len(merged.logprobs) == 3 and left == 1  # stops at the finished output


def test_a_stream_interval_sends_the_first_token_at_once_then_every_n():
    engine_loop = EngineLoop(Engine(EngineConfig()), stream_interval=4).start()
    try:
        params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

        async def run():
            _, queue = await engine_loop.submit(engine_loop.engine.tokenizer.encode("a red boat"), params)
            return await _drain(queue)

        outputs = asyncio.run(run())
    finally:
        engine_loop.stop()
    assert [len(o.token_ids) for o in outputs] == [1, 4, 4, 1]  # first at once, then 4 by 4, the rest at finish
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])


def test_a_stream_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        EngineLoop(None, stream_interval=0)
