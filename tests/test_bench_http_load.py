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
