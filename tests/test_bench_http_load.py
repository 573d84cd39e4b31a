"""bench.http_load's lean client against a real server, and bench.agent_workload's parts."""

from __future__ import annotations

import pytest

from kernelloop.engine.engine import Engine, EngineConfig

from bench.agent_workload import OUTPUT_LENGTHS, build_workload, percentile, summarize
from bench.http_load import SERVED_NAME, PlannedRequest, RequestResult, send_all, send_one_by_one
from tests.serving import serve


@pytest.fixture(scope="module")
def served():
    engine = Engine(EngineConfig())
    with serve(engine, SERVED_NAME) as (base, _):
        yield base, engine


@pytest.mark.parametrize("stream", [False, True])
def test_every_request_gets_its_tokens_and_times_that_add_up(served, stream):
    base, engine = served
    requests = [PlannedRequest(0.05 * i, engine.tokenizer.encode(f"the story of boat {i}"), 3 + i) for i in range(5)]
    seconds, results = send_all(base, requests, stream=stream)
    assert [r.output_tokens for r in results] == [3, 4, 5, 6, 7]  # EOS ignored: exactly max_tokens
    for planned, r in zip(requests, results):
        assert r.arrival >= planned.at - 1e-3  # sent no earlier than planned
        assert 0 < r.ttft <= r.latency and r.arrival + r.latency <= seconds + 1e-3


def test_a_long_stream_is_read_across_many_chunks(served):
    base, engine = served
    (result,) = send_all(base, [PlannedRequest(0.0, engine.tokenizer.encode("once upon a time"), 120)])[1]
    assert result.output_tokens == 120


def test_an_http_error_is_raised_not_counted(served):
    base, _ = served
    with pytest.raises(RuntimeError, match="HTTP"):
        send_all(base, [PlannedRequest(0.0, [10**9], 2)])  # token id out of range: 400


def test_one_by_one_sends_each_after_the_last(served):
    base, engine = served
    requests = [PlannedRequest(5.0, engine.tokenizer.encode("hello"), 2) for _ in range(3)]  # `at` ignored
    seconds, results = send_one_by_one(base, requests)
    assert seconds < 5.0 and sum(r.latency for r in results) <= seconds + 1e-3


def test_the_agent_workload_is_seeded_staggered_and_shares_system_prompts():
    def encode(messages: list[dict[str, str]]) -> list[int]:
        return [hash(messages[0]["content"]) % 1000] * 50 + [len(m["content"]) for m in messages[1:]]

    a, b = build_workload(encode, 40, rate=8.0, seed=3), build_workload(encode, 40, rate=8.0, seed=3)
    assert a == b and a != build_workload(encode, 40, rate=8.0, seed=4)
    arrivals = [r.at for r in a]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and 2.0 < arrivals[-1] < 10.0  # ~40 / 8 s
    assert len({tuple(r.prompt_ids[:50]) for r in a}) == 3  # three shared system prompts
    lengths = {r.max_tokens for r in a}
    assert min(lengths) >= OUTPUT_LENGTHS[0] and max(lengths) <= OUTPUT_LENGTHS[1] and len(lengths) > 5
    assert len({len(r.prompt_ids) for r in a}) > 3  # conversations of different depths


def test_summary_rates_and_percentiles():
    results = [RequestResult(0.0, t, 2 * t, 10) for t in (0.1, 0.2, 0.3, 0.4)]
    row = summarize("w", "s", 2.0, results)
    assert row["output tokens/s"] == 20.0 and row["requests/s"] == 2.0
    assert row["TTFT p50 ms"] in (200.0, 300.0) and row["TTFT p99 ms"] == 400.0
    assert percentile([5.0], 99) == 5.0


def test_streamed_requests_time_each_token_chunk(served):
    base, engine = served
    (result,) = send_all(base, [PlannedRequest(0.0, engine.tokenizer.encode("a quiet road"), 6)])[1]
    # A slow event loop merges waiting outputs into one chunk (engine.loop.next_output): at most one chunk a token.
    assert result.output_tokens == 6
    assert 1 <= len(result.chunk_times) <= 6 and list(result.chunk_times) == sorted(result.chunk_times)
    assert result.chunk_times[0] >= result.arrival + result.ttft - 1e-6


def test_burst_gaps_split_into_steady_and_during_the_burst():
    from bench.burst import gaps_around

    stream = RequestResult(0.0, 0.1, 3.6, 7, chunk_times=(0.1, 0.5, 0.9, 1.2, 2.2, 2.4, 3.5, 3.6))
    steady, during = gaps_around([stream], at=1.0, end=3.0)
    assert steady == pytest.approx([0.4, 0.4, 0.1]) and during == pytest.approx([0.3, 1.0, 0.2, 1.1])


@pytest.mark.parametrize("block", [1, 3, 7, 64, 1 << 16])
def test_chunked_bodies_are_split_into_lines_whatever_blocks_they_arrive_in(block):
    import asyncio

    from bench.http_load import _chunked_lines

    lines = [b"data: {\"a\": 1}", b"", b"data: {\"b\": 22}", b"", b"data: [DONE]", b"", b"tail without newline"]
    body = b"\n".join(lines)
    cuts = [0, 5, 6, 30, 31, len(body)]  # a line split across chunks, a chunk holding several lines
    wire = b"".join(b"%x;ext=1\r\n" % (b - a) + body[a:b] + b"\r\n" if i % 2 else b"%x\r\n" % (b - a) + body[a:b] + b"\r\n"
                    for i, (a, b) in enumerate(zip(cuts, cuts[1:])) if b > a) + b"0\r\n\r\n"

    async def read_all(data: bytes) -> list[bytes]:
        reader = asyncio.StreamReader()
        for i in range(0, len(data), block):
            reader.feed_data(data[i:i + block])
        reader.feed_eof()
        return [line async for line in _chunked_lines(reader)]

    assert asyncio.run(read_all(wire)) == lines
    cut_short = wire[:-len(b"0\r\n\r\n")]  # the connection closed before the last chunk: what came is kept
    assert asyncio.run(read_all(cut_short)) == lines


def test_a_burst_does_equal_work_in_process_and_over_http_streamed_or_not(served):
    from bench.burst import burst_prompts, http_burst
    from bench.engine_throughput import run_engine

    base, engine = served
    prompts = burst_prompts(4, engine.model_config.vocab_size, seed=5)
    assert all(16 <= len(p) <= 64 for p in prompts)
    seconds, tokens = run_engine(Engine(EngineConfig()), prompts, 3)
    assert seconds > 0 and tokens == 4 * 3
    for stream in (False, True):
        seconds, tokens, results = http_burst(base, prompts, 3, stream)
        assert tokens == 4 * 3 and len(results) == 4 and all(r.latency <= seconds for r in results)
        # a streamed request's waiting outputs go out as one chunk when the server's loop lags (engine.loop.next_output)
        assert all((1 <= len(r.chunk_times) <= 3) if stream else not r.chunk_times for r in results)
