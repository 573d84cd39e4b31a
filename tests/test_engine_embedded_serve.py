"""`engine serve` with no arguments serves the embedded model to the official openai client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest


@pytest.fixture(scope="module")
def served(embedded_model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "KERNELLOOP_CACHE": str(embedded_model_dir.parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "kernelloop.engine.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"engine serve did not come up: {proc.stdout.read()}")
    yield base
    proc.terminate()
    proc.wait(30)


def test_the_openai_client_gets_answers_plain_and_streamed(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "What is 3 plus 4?"}]
    answer = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0)
    assert "7" in answer.choices[0].message.content and answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == answer.choices[0].message.content
    text = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0)
    pieces = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text and text.choices[0].text.strip()
