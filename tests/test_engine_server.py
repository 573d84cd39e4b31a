"""The HTTP server against the official openai client, over real HTTP on localhost."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.profiler.analysis import profile_rows

from tests.hf_checkpoints import make_checkpoint
from tests.serving import serve

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("srv") / "ckpt", "gqa")
    with serve(Engine(EngineConfig(model=str(path))), MODEL) as running:
        yield running


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=60)


PROMPT = "w5 w17 w9 w30 w44"


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server[0]}/health").json()["status"] == "ok"


def test_completion_plain_and_streamed_agree(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    choice = full.choices[0]
    assert choice.finish_reason == "length" and full.usage.completion_tokens == 6
    assert len(choice.logprobs.token_logprobs) == 6 and all(len(t) == 2 for t in choice.logprobs.top_logprobs)
    pieces = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in pieces) == choice.text
    assert pieces[-1].choices[0].finish_reason == "length"


def test_prompt_as_token_ids_equals_text(client):
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=[5, 17, 9, 30, 44], max_tokens=4, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text


def test_chat_plain_and_streamed(client):
    messages = [{"role": "system", "content": "w7 w8"}, {"role": "user", "content": "w9 w10"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=2, extra_body={"ignore_eos": True})
    msg = full.choices[0]
    assert msg.message.role == "assistant" and msg.finish_reason == "length"
    assert len(msg.logprobs.content) == 5 and len(msg.logprobs.content[0].top_logprobs) == 2
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.message.content
    assert chunks[-1].usage.completion_tokens == 5


def test_concurrent_requests_equal_sequential(client):
    from openai import AsyncOpenAI

    prompts = [" ".join(f"w{(i * 7 + j) % 200 + 3}" for j in range(3 + i)) for i in range(8)]
    sequential = [client.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0).choices[0].text
                  for p in prompts]

    async def run_all():
        aclient = AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0, timeout=60)
        results = await asyncio.gather(*(aclient.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0)
                                         for p in prompts))
        return [r.choices[0].text for r in results]

    assert asyncio.run(run_all()) == sequential


@pytest.mark.parametrize("body,status,needle", [
    ({"model": "gpt-4", "prompt": "w1"}, 404, "does not exist"),
    ({"model": MODEL, "prompt": "w1", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "prompt": "w1", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": [5, 99999]}, 400, "token ids"),
    ({"model": MODEL, "prompt": " ".join(["w5"] * 2000)}, 400, "prompt has"),
    ({"model": MODEL}, 400, "prompt"),
    ({"model": MODEL, "prompt": "w1", "n": 3}, 400, "n=1"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client, body, status, needle):
    r = httpx.post(f"{server[0]}/v1/completions", json=body, timeout=30)
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]
    assert client.completions.create(model=MODEL, prompt="w1", max_tokens=1).choices[0].text is not None


def test_malformed_json_is_a_400(server):
    r = httpx.post(f"{server[0]}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_metrics_reload_and_profile(server, client):
    base = server[0]
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    text = httpx.get(f"{base}/metrics").text
    for name in ("generation_tokens_per_second", "running_requests", "waiting_requests", "kv_cache_usage",
                 "prefix_cache_hit_rate", "kernel_variant"):
        assert f"kernelloop_{name}" in text
    assert 'op="rmsnorm"' in text and 'variant="reference"' in text
    assert httpx.post(f"{base}/kernels/reload").json()["changed"] == {}
    assert httpx.post(f"{base}/profile/start").json()["status"] == "started"
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"ignore_eos": True})
    profile = httpx.post(f"{base}/profile/stop").json()
    assert profile["steps"] >= 4 and profile["output_tokens"] >= 4
    table = profile_rows(profile["raw"], rates=None)  # what profiler/ makes of the raw figures
    rows = {r["name"]: r for r in table}
    assert sum(r["share"] for r in table) == pytest.approx(1.0)
    for op in ("linear", "extend_attention", "decode_attention"):
        assert rows[op]["kind"] == "op" and rows[op]["calls"] > 0 and rows[op]["shapes"], op
    assert {(s["shape"]["n"], s["shape"]["k"]) for s in rows["linear"]["shapes"]} == {
        (128, 48), (48, 64), (224, 48), (48, 112), (211, 48)}  # fused qkv, o, gate_up, down, lm_head (tied)
    assert "matmul" not in rows and "attention (prefill, torch)" not in rows
