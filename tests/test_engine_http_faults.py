"""Faults and bad input against a real server: every error is an OpenAI error object with
the right status, a big prompt does not stall the server, bodies are capped, and a non-streamed
request whose client goes away is aborted."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from kernelloop.engine import server as server_module
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.tokenizer import Tokenizer

from tests.hf_checkpoints import make_checkpoint
from tests.serving import serve

MODEL = "tiny-llama"
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("faults") / "gqa", "gqa")


@pytest.fixture(scope="module")
def server(checkpoint):
    with serve(Engine(EngineConfig(model=str(checkpoint))), MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def small_cap():
    """A server whose body limit is 64 KiB (the default, read when the app is made, patched)."""
    return 64 << 10


@pytest.fixture(scope="module")
def capped_server(checkpoint, small_cap):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server_module, "MAX_BODY_BYTES", small_cap)
        with serve(Engine(EngineConfig(model=str(checkpoint))), MODEL) as running:
            yield running


def assert_openai_error(r: httpx.Response, status: int, kind: str = "invalid_request_error") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


def completion(prompt_json: str, extra: str = "") -> bytes:
    return f'{{"model": "{MODEL}", "prompt": {prompt_json}{extra}}}'.encode()


def chat(content_json: str) -> bytes:
    return f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {content_json}}}]}}'.encode()


# -- 1. every error is an OpenAI error object with the right status ----------------------------------

BAD = [
    # lone surrogates reach the tokenizer as non-text (was: 500 "TextInputSequence must be str")
    ("POST", "/v1/completions", completion(r'"w5 \ud800"'), 400, "surrogate"),
    ("POST", "/v1/completions", completion(r'["\udfff w5"]'), 400, "surrogate"),
    ("POST", "/v1/completions", completion('"w5"', r', "stop": ["\ud800"]'), 400, "surrogate"),
    ("POST", "/v1/completions", completion('"w5"', r', "\ud800": 1'), 400, "surrogate"),
    ("POST", "/v1/chat/completions", chat(r'"\ud800"'), 400, "messages.0.content"),
    ("POST", "/v1/chat/completions", chat(r'[{"type": "text", "text": "w5 \udbff"}]'), 400, "surrogate"),
    ("POST", "/v1/chat/completions", chat('[{"type": "text", "text": 5}]'), 400, "messages.0.content"),
    # /gate/measure: the engine's refusals and a validated body (was: 500)
    ("POST", "/gate/measure", b'{"prompts": [[5, 99999]], "max_tokens": 2}', 400, "token ids"),
    ("POST", "/gate/measure", json.dumps({"prompts": [[5], [5] * 2000]}).encode(), 400, "prompts.1: the prompt has"),
    ("POST", "/gate/measure", b'{"prompts": [[5, true]]}', 400, "prompts"),
    ("POST", "/gate/measure", b'{"prompts": [[5, 1.5]]}', 400, "prompts"),
    ("POST", "/gate/measure", b'{"prompts": [[5]], "max_tokens": true}', 400, "max_tokens"),
    ("POST", "/gate/measure", b'{"prompts": [[5]], "max_tokens": 0}', 400, "max_tokens"),
    ("POST", "/gate/measure", b'{"prompts": [[5]], "warmup": "no"}', 400, "warmup"),
    ("POST", "/gate/measure", b'[[5]]', 400, "JSON object"),
    ("POST", "/gate/measure", b'{"prompts": [[5]', 400, "malformed JSON"),
    # bodies no JSON parser should see through (was: {"detail": ...})
    ("POST", "/v1/completions", b'{"model": "tiny-llama", "prompt": "\xff\xfe"}', 400, "not valid UTF-8"),
    ("POST", "/v1/completions", b"[" * 100_000, 400, "nests too deeply"),
    ("POST", "/v1/completions", completion("1" * 5000), 400, "malformed JSON"),
    ("POST", "/v1/chat/completions", b'{"model": ', 400, "malformed JSON"),
    ("POST", "/v1/chat/completions", b"", 400, "empty"),
    ("POST", "/v1/completions", b"[1, 2]", 400, "JSON object"),
    # routes and methods
    ("GET", "/v1/nothing-here", b"", 404, "Invalid URL (GET /v1/nothing-here)"),
    ("POST", "/v2/completions", completion('"w5"'), 404, "Invalid URL"),
    ("GET", "/v1/completions", b"", 405, "use POST"),
    ("DELETE", "/health", b"", 405, "not allowed"),
]


@pytest.mark.parametrize("method,path,content,status,needle", BAD,
                         ids=[f"{i}-{method} {path}" for i, (method, path, *_) in enumerate(BAD)])
def test_bad_input_gets_an_openai_error_with_the_right_status(server, method, path, content, status, needle):
    r = httpx.request(method, f"{server[0]}{path}", content=content, headers={"content-type": "application/json"},
                      timeout=30)
    error = assert_openai_error(r, status)
    assert needle in error["message"], error
    if status == 405:
        assert r.headers["allow"]


def test_the_server_keeps_serving_after_bad_input_and_takes_valid_unicode(server):
    for method, path, content, *_ in BAD:
        httpx.request(method, f"{server[0]}{path}", content=content, timeout=30)
    # A surrogate pair (how json.dumps escapes an emoji) is text, and no content-type is needed.
    r = httpx.post(f"{server[0]}/v1/completions", content=completion(r'"w5 \ud83d\ude00 w7"', ', "max_tokens": 2'),
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert server[1].engine.requests == {}


def test_an_unexpected_exception_is_a_logged_500_error_object(server, monkeypatch, caplog):
    def broken() -> float:
        raise RuntimeError("boom")

    monkeypatch.setattr(server[1], "tokens_per_second", broken)
    with caplog.at_level(logging.ERROR, logger="kernelloop.engine.server"):
        r = httpx.get(f"{server[0]}/metrics", timeout=30)
    error = assert_openai_error(r, 500, kind="server_error")
    assert "RuntimeError" in error["message"] and "Traceback" not in r.text
    assert any(rec.exc_info and "boom" in str(rec.exc_info[1]) for rec in caplog.records)


def test_a_client_gone_mid_body_is_no_server_error(server, caplog):
    host, port = server[0].removeprefix("http://").split(":")
    with caplog.at_level(logging.ERROR):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
            time.sleep(0.2)
        assert httpx.get(f"{server[0]}/health", timeout=30).status_code == 200
        time.sleep(0.2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# -- 2. big prompts: tokenized off the event loop, bodies capped --------------------------------------


def test_health_and_generation_go_on_while_a_big_prompt_is_tokenized(server):
    base = server[0]
    big = {"model": MODEL, "prompt": " ".join(["w5"] * 600_000)}  # 1.8 MB, seconds to tokenize
    done: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: done.append(httpx.post(f"{base}/v1/completions", json=big, timeout=120)))
    marks = [time.perf_counter()]  # when the big request began, then each answer to a poll
    sender.start()
    small = None
    while sender.is_alive():
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        if small is None:  # the engine goes on generating too
            small = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "w5 w6", "max_tokens": 2},
                               timeout=30)
        marks.append(time.perf_counter())
        time.sleep(0.05)
    sender.join()
    marks.append(time.perf_counter())
    assert "the prompt has 600000 tokens" in done[0].json()["error"]["message"]  # tokenized, then refused
    assert small is not None and small.status_code == 200
    # The server runs in this process: a tokenizer holding the GIL (or the event loop) freezes the
    # polling too, which shows as one long gap between answers, as long as the tokenization.
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    took = marks[-1] - marks[0]
    assert took > 3 * max(gaps), (took, gaps)


def raw_exchange(base: str, head: bytes, body_parts: list[bytes] = ()) -> tuple[int, dict]:
    """Send a hand-made request over a socket; the response's status and JSON body."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        for part in body_parts:
            s.sendall(part)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    header, _, payload = data.partition(b"\r\n\r\n")
    return int(header.split()[1]), json.loads(payload)


def test_a_declared_length_over_the_default_cap_gets_413_before_any_body_is_sent(server):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {server_module.MAX_BODY_BYTES + 1}\r\nConnection: close\r\n\r\n").encode()
    status, body = raw_exchange(server[0], head)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert server_module.MAX_BODY_BYTES == 8 << 20


def test_bodies_over_the_cap_get_413_declared_or_streamed(capped_server, small_cap):
    base = capped_server[0]
    prompt = " ".join(["w5"] * (small_cap // 3))  # just over the cap once in JSON
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    assert small_cap < len(body) < small_cap + 1000
    declared = httpx.post(f"{base}/v1/completions", content=body, timeout=30)
    assert_openai_error(declared, 413)
    chunks = [body[i:i + 4096] for i in range(0, len(body), 4096)]
    streamed = httpx.post(f"{base}/v1/completions", content=iter(chunks), timeout=30)  # chunked: no length
    assert "content-length" not in streamed.request.headers
    assert assert_openai_error(streamed, 413)["code"] == "request_too_large"
    for route in ("/v1/chat/completions", "/gate/measure", "/kernels/reload", "/profile/start"):
        assert_openai_error(httpx.post(f"{base}{route}", content=iter(chunks), timeout=30), 413)
    # Under the cap the same route answers as usual (here: tokenized, then too long for the model).
    half = json.dumps({"model": MODEL, "prompt": " ".join(["w5"] * (small_cap // 6))}).encode()
    ok = httpx.post(f"{base}/v1/completions", content=iter([half[:100], half[100:]]), timeout=30)
    assert ok.status_code == 400 and "the prompt has" in ok.json()["error"]["message"]


# -- 3. a non-streamed request is aborted when its client goes away ----------------------------------


async def _stats(loop) -> tuple[int, int]:
    return await loop.call(lambda: (loop.engine.stats["generated_tokens"], len(loop.engine.requests)))


def engine_state(loop) -> tuple[int, int]:
    """(tokens generated so far, requests in the engine), read between two steps."""
    import asyncio

    return asyncio.run(_stats(loop))


def test_a_non_streamed_request_is_aborted_when_its_client_disconnects(server):
    base, loop = server
    generated_before, _ = engine_state(loop)
    body = json.dumps({"model": MODEL, "prompt": "w5 w6 w7", "max_tokens": 1000, "ignore_eos": True}).encode()
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.time() + 30
        while engine_state(loop)[0] - generated_before < 10:  # it is decoding
            assert time.time() < deadline, "the request never started"
            time.sleep(0.02)
    closed = time.time()
    while engine_state(loop)[1]:
        assert time.time() - closed < 5, "the request outlived its client"
        time.sleep(0.02)
    generated = engine_state(loop)[0] - generated_before
    assert generated < 1000, "the engine decoded the whole request for nobody"


def test_the_tokenizer_encodes_the_same_without_the_gil():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(["the red fox, a café in 東京 😀"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok = Tokenizer(hf, {"bos_token": "<s>"})
    text = "the red fox, a café in 東京 and 😀 too"
    assert tok.encode(text)[0] == 0 and tok.encode(text, False)[0] != 0
    for special in (True, False):
        assert tok.encode_without_gil(text, special) == tok.encode(text, special)
