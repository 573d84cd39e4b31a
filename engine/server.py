"""The OpenAI-compatible HTTP server (FastAPI): completions, chat, streaming, health, metrics,
profile hooks and hot kernel reload.

Every error is an OpenAI-style error object: 400 for bad requests, 413 for bodies over
`max_body_bytes`, 404/405 for unknown routes and methods, and a logged 500 for anything else.
Parsing and tokenization run in worker threads, so a big prompt does not stall the event loop; a
request whose client goes away is aborted, streamed or not.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelloop.engine import audit_endpoint, gate_endpoint, reload_endpoint
from kernelloop.engine.audit_queue import AuditQueue
from kernelloop.engine.detokenizer import TokenBytes
from kernelloop.engine.engine import InvalidRequest, StepOutput
from kernelloop.engine.loop import Arrival, EngineLoop, merge_outputs, next_output
from kernelloop.engine.metrics import render_metrics
from kernelloop.engine.openai_api import (
    APIError,
    Body,
    ChatReply,
    ChatRequest,
    CompletionReply,
    CompletionRequest,
    new_id,
    parse_body,
    parse_request,
    usage,
    validation_error,
)
from kernelloop.engine.profiling import StepProfiler
from kernelloop.engine.sampling import InvalidSamplingParams, SamplingParams

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
# Bodies above this get 413. Valid ones are far smaller: /gate/measure's 16 prompts of 8192 token ids
# take about 1 MiB, a prompt of 8192 tokens as text well under that, and even a 128k-token context
# (--max-model-len on a long-context model) about 1-3 MiB of text, \u-escaped or not. The cap bounds
# what one request can make the server buffer, parse and tokenize.
MAX_BODY_BYTES = 8 << 20
TOO_LARGE = "request_too_large"


class HTTPGuard:
    """ASGI middleware around the routes: refuses bodies over `max_body_bytes` with 413 (on
    Content-Length before reading any, else once the streamed body passes it), and answers an
    exception no handler took with a logged 500 carrying an OpenAI error object."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = f"the request body is larger than this server's limit of {self.max_body_bytes} bytes"
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return await send_error(send, APIError(413, too_large, code=TOO_LARGE))
        received, started = 0, False

        async def capped_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(413, too_large)  # FastAPI's own body parsing passes these on
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, watched_send)
        except ClientDisconnect:  # gone while its body was read: nobody to answer
            return
        except Exception as exc:
            if started:  # mid-stream: no status left to send; uvicorn logs it and closes the connection
                raise
            if not isinstance(exc, APIError):
                log.exception("%s %s failed", scope["method"], scope["path"])
                exc = APIError(500, f"internal server error ({type(exc).__name__}); the server log has the details",
                               kind="server_error")
            await send_error(send, exc)


async def send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def until_disconnected(http: HTTPRequest) -> None:
    """Returns when the client closes the connection (call once the body has been read)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def answer(loop: EngineLoop, http: HTTPRequest, body: CompletionRequest | ChatRequest, ids: list[int],
                 params: SamplingParams, reply: CompletionReply | ChatReply,
                 audit: AuditQueue | None = None, arrival: Arrival | None = None) -> Response | dict[str, Any]:
    """Run one completion (or chat) request: an event stream of `reply` chunks, or `reply` whole; a finished
    request is offered to the shadow audit's queue (`audit`)."""
    try:
        rid, queue = await loop.submit(ids, params, stream=body.stream, arrival=arrival)
    except InvalidRequest as exc:
        raise APIError(400, str(exc), param="prompt") from None
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        done = lambda out, tokens, logprobs: audit_endpoint.sample(audit, loop.engine, body, ids, out, tokens, logprobs)
        return StreamingResponse(events(loop, rid, queue, reply, len(ids), include_usage, done),
                                 media_type="text/event-stream")
    out = await finished(loop, rid, queue, http)
    if out is None:
        return Response(status_code=499)  # nobody is left to read it
    audit_endpoint.sample(audit, loop.engine, body, ids, out)
    return reply.whole(out, usage(len(ids), len(out.token_ids)))


async def finished(loop: EngineLoop, rid: str, queue: asyncio.Queue, http: HTTPRequest) -> StepOutput | None:
    """A request's merged outputs once it finishes; None, the request aborted, when the client goes
    away first."""
    gone = asyncio.ensure_future(until_disconnected(http))
    out: StepOutput | None = None
    try:
        while out is None or not out.finished:
            got = asyncio.ensure_future(queue.get())
            try:
                await asyncio.wait((got, gone), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                got.cancel()
                raise
            if not got.done():  # the client went away first
                got.cancel()
                return None
            out = merge_outputs(out, got.result())
        return out
    finally:
        gone.cancel()
        if out is None or not out.finished:
            loop.abort(rid)  # free its KV (also when this handler is cancelled)


async def events(loop: EngineLoop, rid: str, queue: asyncio.Queue, reply: CompletionReply | ChatReply,
                 prompt_tokens: int, include_usage: bool,
                 done: Callable[[StepOutput, list[int], list], None] | None = None) -> AsyncIterator[str]:
    """A streamed request's server-sent events; the request is aborted if the client goes away. `done(last
    output, all token ids, all logprobs)` runs once it finishes."""
    tokens, out, ids, logprobs = 0, None, [], []
    try:
        while True:
            out = await next_output(queue)
            tokens += len(out.token_ids)
            ids += out.token_ids
            logprobs += out.logprobs
            yield f"data: {json.dumps(reply.chunk(out))}\n\n"
            if out.finished:
                break
        if done is not None:
            done(out, ids, logprobs)
        if include_usage:
            yield f"data: {json.dumps(reply.usage_chunk(usage(prompt_tokens, tokens)))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if out is None or not out.finished:
            loop.abort(rid)  # free its KV


def create_app(loop: EngineLoop, model_names: str | Sequence[str], max_body_bytes: int | None = None,
               audit: AuditQueue | None = None) -> FastAPI:
    """`model_names`: the model ids the API answers to (the first is the main one);
    `max_body_bytes`: larger request bodies get 413 (default MAX_BODY_BYTES); `audit`: the shadow audit's
    queue of sampled finished requests (default: an empty one, rate 0)."""
    app = FastAPI(title="kernelloop engine")
    app.add_middleware(HTTPGuard, max_body_bytes=MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes)
    engine = loop.engine
    names = [model_names] if isinstance(model_names, str) else list(model_names)
    if not names:
        raise ValueError("at least one served model name is needed")
    token_bytes = TokenBytes(engine.tokenizer)
    profiler = StepProfiler(loop)
    gate_lock = asyncio.Lock()
    audit = audit if audit is not None else AuditQueue(0.0)
    app.include_router(audit_endpoint.router(audit))

    def error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: HTTPRequest, exc: InvalidRequest) -> JSONResponse:
        return error_response(APIError(400, str(exc)))

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(_: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(http: HTTPRequest, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"Invalid URL ({http.method} {http.url.path}): this server has no such route"
        elif exc.status_code == 405 and message == "Method Not Allowed":
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{http.method} is not allowed on {http.url.path}" + (f"; use {allowed}" if allowed else "")
        code = TOO_LARGE if exc.status_code == 413 else None
        return error_response(APIError(exc.status_code, message, code=code), headers=exc.headers)

    async def read(http: HTTPRequest, model: type[Body]) -> Body:
        return await asyncio.to_thread(parse_request, model, await http.body())

    def check_model(name: str) -> str:
        """The served name the request asked for (responses echo it); 404 for any other."""
        if name not in names:
            served = ", ".join(repr(n) for n in names)
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}",
                           param="model", code="model_not_found")
        return name

    def token_text(token_id: int) -> str:
        return engine.tokenizer.decode([token_id], skip_special_tokens=False)

    def sampling(body: CompletionRequest | ChatRequest, logprobs: int | None) -> SamplingParams:
        try:
            return body.sampling(logprobs, DEFAULT_MAX_TOKENS)
        except InvalidSamplingParams as exc:
            raise APIError(400, str(exc), param=getattr(exc, "field", None)) from None

    def chat_prompt_ids(body: ChatRequest) -> list[int]:
        messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in body.messages]
        try:
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        return engine.tokenizer.encode_without_gil(prompt, add_special_tokens=False)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok" if loop.error is None else "degraded", "last_error": loop.error,
                "device": engine.kernels.fingerprint, "kernels": engine.kernels.mode, "model": names[0],
                "model_dir": str(engine.model_dir),
                "registry": str(engine.kernels.registry.path) if engine.kernels.registry is not None else None}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        # max_model_len: the most tokens (prompt + output) one request can have, as add_request enforces.
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "kernelloop",
                                            "max_model_len": engine.max_model_len} for name in names]}

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        with loop.arriving() as arrival:
            body = await read(http, CompletionRequest)
            model_name = check_model(body.model)
            prompt = body.prompt_text_or_ids()
            params = sampling(body, body.logprobs)
            if isinstance(prompt, str):
                ids = await asyncio.to_thread(engine.tokenizer.encode_without_gil, prompt)
            else:
                ids = list(prompt)
            reply = CompletionReply(new_id("cmpl"), model_name, params.logprobs is not None, token_text)
            return await answer(loop, http, body, ids, params, reply, audit, arrival)

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        with loop.arriving() as arrival:
            body = await read(http, ChatRequest)
            model_name = check_model(body.model)
            if body.max_completion_tokens is not None and body.max_tokens is None:
                body.max_tokens = body.max_completion_tokens
            params = sampling(body, body.logprob_count())
            ids = await asyncio.to_thread(chat_prompt_ids, body)
            reply = ChatReply(new_id("chatcmpl"), model_name, params.logprobs is not None, token_text, token_bytes)
            return await answer(loop, http, body, ids, params, reply, audit, arrival)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        snapshot = await loop.call(lambda: render_metrics(loop))
        snapshot += "\n".join(audit.metrics_lines()) + "\n"
        return PlainTextResponse(snapshot, media_type="text/plain; version=0.0.4")

    @app.post("/kernels/reload")
    async def reload(http: HTTPRequest) -> dict[str, Any]:
        return await reload_endpoint.reload(loop, await http.body())

    @app.post("/gate/measure")
    async def gate_measure(http: HTTPRequest) -> dict[str, Any]:
        body = await asyncio.to_thread(parse_body, await http.body())
        return await gate_endpoint.measure(loop, gate_lock, body)

    @app.post("/gate/generate")
    async def gate_generate(http: HTTPRequest) -> dict[str, Any]:
        body = await asyncio.to_thread(parse_body, await http.body())
        return await gate_endpoint.generate(loop, gate_lock, body)

    @app.post("/gate/invariance")
    async def gate_invariance(http: HTTPRequest) -> dict[str, Any]:
        body = await asyncio.to_thread(parse_body, await http.body())
        return await gate_endpoint.invariance(loop, gate_lock, body)

    @app.post("/profile/start")
    async def profile_start(body: dict[str, Any] | None = None) -> dict[str, Any]:
        # body {"max_seconds": N}: stops recording by itself after N s; 409 while a profile records
        return await profiler.start(body)

    @app.post("/profile/stop")
    async def profile_stop() -> dict[str, Any]:
        return await profiler.stop()  # answers during a long step, with the steps that had ended

    return app
