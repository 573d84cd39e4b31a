"""Load an `engine serve` process over HTTP the way clients do, and time what they see.

`EngineServer` starts `python -m engine.cli serve` in its own process (so the numbers include the
process boundary, the event loop and the engine thread, as users get them) and waits for /health.
`send_all` fires planned requests at their arrival times from one asyncio client and records, per
request, the time to the first streamed token (TTFT), the latency to the last, and the tokens.

The client is a minimal HTTP/1.1 one on asyncio streams (one connection per request, as separate
clients have), like the lean load generators serving benchmarks use: httpx spends ~1.6 ms of CPU
per request here, which on a 2-core machine is taken from the server being measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Coroutine, Sequence, TypeVar
from urllib.parse import urlsplit

import httpx

SERVED_NAME = "bench"
T = TypeVar("T")


@dataclass(frozen=True)
class PlannedRequest:
    at: float  # seconds after the start of the run
    prompt_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class RequestResult:
    arrival: float  # seconds after the start of the run, when it was sent
    ttft: float  # seconds from sending to the first generated token
    latency: float  # seconds from sending to the last byte
    output_tokens: int
    chunk_times: tuple[float, ...] = ()  # streamed: seconds after the run's start at which each token chunk came


class EngineServer:
    """`engine serve` in a subprocess on a free port; a context manager yielding its base URL."""

    def __init__(self, model: str | None = None, threads: int | None = None, extra: Sequence[str] = ()):
        self.args = [sys.executable, "-m", "kernelloop.engine.cli", "serve", "--served-model-name", SERVED_NAME, *extra]
        if model:
            self.args += ["--model", model]
        if threads:
            self.args += ["--threads", str(threads)]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(self.args + ["--port", str(port)], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600  # a first `--model smollm2` run converts the checkpoint
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine serve exited with {self.proc.returncode}: {' '.join(self.args)}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    return base
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("engine serve did not answer /health within 600 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _post(base: str, path: str, body: dict) -> AsyncIterator[bytes]:
    """POST `body` as JSON on a new connection; yields the response body's lines (chunked or not)."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        data = json.dumps(body).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        status = (await reader.readline()).split(b" ", 2)
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        if len(status) < 2 or status[1] != b"200":
            raise RuntimeError(f"{path}: HTTP {status[1:2]} {await reader.read(500)!r}")
        if headers.get("transfer-encoding") == "chunked":
            async for line in _chunked_lines(reader):
                yield line
        else:
            yield await reader.readexactly(int(headers["content-length"]))
    finally:
        writer.close()


async def _chunked_lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a chunked body, read a block at a time: one await per block the socket holds rather
    than three per chunk (the client shares the cores with the server it measures)."""
    raw, text, ended = b"", b"", False  # received, not yet de-chunked; de-chunked, not yet split into lines
    while True:
        while not ended and (end := raw.find(b"\r\n")) >= 0:
            size = int(raw[:end].split(b";")[0].strip() or b"0", 16)
            ended = size == 0  # the last chunk
            if not ended and len(raw) < end + 2 + size + 2:  # the chunk and its CRLF are not all here yet
                break
            text += raw[end + 2:end + 2 + size]
            raw = raw[end + 4 + size:]
        *lines, text = text.split(b"\n")
        for line in lines:
            yield line
        block = b"" if ended else await reader.read(1 << 16)
        if not block:  # the last chunk, or the connection closed before it
            if text:
                yield text
            return
        raw += block


async def _one(base: str, req: PlannedRequest, t0: float, stream: bool) -> RequestResult:
    await asyncio.sleep(max(0.0, t0 + req.at - time.perf_counter()))
    sent = time.perf_counter()
    body = {"model": SERVED_NAME, "prompt": req.prompt_ids, "max_tokens": req.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    first, tokens, chunks = None, 0, []
    async for line in _post(base, "/v1/completions", body):
        if not stream:
            tokens = json.loads(line)["usage"]["completion_tokens"]
        elif line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("choices"):
                chunks.append(time.perf_counter() - t0)
                first = first or time.perf_counter()
    done = time.perf_counter()
    return RequestResult(sent - t0, (first or done) - sent, done - sent, tokens, tuple(chunks))


async def _send_all(base: str, requests: Sequence[PlannedRequest], stream: bool) -> tuple[float, list[RequestResult]]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*[_one(base, r, t0, stream) for r in requests])
    return time.perf_counter() - t0, list(results)


def send_all(base: str, requests: Sequence[PlannedRequest], stream: bool = True) -> tuple[float, list[RequestResult]]:
    """Send every request at its `at`; returns (seconds from the start to the last response, results)."""
    return _run(_send_all(base, requests, stream))


def _run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (the server's loop too): less client CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def send_one_by_one(base: str, requests: Sequence[PlannedRequest]) -> tuple[float, list[RequestResult]]:
    """One stream: each request sent when the previous one has finished (arrival times ignored)."""
    start, results = time.perf_counter(), []
    for r in requests:
        _, (result,) = send_all(base, [PlannedRequest(0.0, r.prompt_ids, r.max_tokens)])
        results.append(result)
    return time.perf_counter() - start, results
