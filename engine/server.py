"""The OpenAI-compatible HTTP server (FastAPI): completions, chat, streaming, health, metrics,
profile hooks and hot kernel reload. Bad requests get OpenAI-style error JSON and a 4xx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from engine.detokenizer import TokenBytes
from engine.engine import InvalidRequest, StepOutput
from engine.loop import EngineLoop, next_output
from engine.metrics import render_metrics
from engine.openai_api import (APIError, ChatRequest, CompletionRequest, chat_body, chat_chunk, chat_logprobs,
                               completion_body, completion_logprobs, new_id, next_text_offset, usage)
from engine import gate_endpoint
from engine.profiling import StepProfiler
from engine.sampling import InvalidSamplingParams

DEFAULT_MAX_TOKENS = 256


def create_app(loop: EngineLoop, model_names: str | Sequence[str]) -> FastAPI:
    """`model_names`: the model ids the API answers to (the first is the main one)."""
    app = FastAPI(title="kernelloop engine")
    engine = loop.engine
    names = [model_names] if isinstance(model_names, str) else list(model_names)
    if not names:
        raise ValueError("at least one served model name is needed")
    token_bytes = TokenBytes(engine.tokenizer)
    profiler = StepProfiler(loop)
    gate_lock = asyncio.Lock()

    @app.exception_handler(APIError)
    async def api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = "malformed JSON body" if first.get("type") == "json_invalid" else f"{where}: {first.get('msg', 'invalid')}"
        return JSONResponse(APIError(400, message, param=where or None).body(), status_code=400)

    def check_model(name: str) -> str:
        """The served name the request asked for (responses echo it); 404 for any other."""
        if name not in names:
            served = ", ".join(repr(n) for n in names)
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}",
                           param="model", code="model_not_found")
        return name

    def token_text(token_id: int) -> str:
        return engine.tokenizer.decode([token_id], skip_special_tokens=False)

    async def start(prompt_ids: list[int], params, stream: bool) -> tuple[str, Any]:
        try:
            return await loop.submit(prompt_ids, params, stream=stream)
        except InvalidRequest as exc:
            raise APIError(400, str(exc), param="prompt") from None

    def sampling(body, logprobs: int | None):
        try:
            return body.sampling(logprobs, DEFAULT_MAX_TOKENS)
        except InvalidSamplingParams as exc:
            raise APIError(400, str(exc), param=getattr(exc, "field", None)) from None

    async def collect(rid: str, queue) -> tuple[str, list, str | None, int]:
        text, logprobs, tokens = "", [], 0
        while True:
            out: StepOutput = await queue.get()
            text += out.text
            logprobs += [lp for lp in out.logprobs if lp is not None]
            tokens += len(out.token_ids)
            if out.finished:
                return text, logprobs, out.finish_reason, tokens

    async def stream(rid: str, queue, chunk, final_usage) -> AsyncIterator[str]:
        tokens, out = 0, None
        try:
            while True:
                out: StepOutput = await next_output(queue)
                tokens += len(out.token_ids)
                body = chunk(out)
                if body is not None:
                    yield f"data: {json.dumps(body)}\n\n"
                if out.finished:
                    break
            extra = final_usage(tokens)
            if extra is not None:
                yield f"data: {json.dumps(extra)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if out is None or not out.finished:
                loop.abort(rid)  # the client went away: free its KV

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok" if loop.error is None else "degraded", "last_error": loop.error,
                "device": engine.kernels.device, "kernels": engine.kernels.mode, "model": names[0],
                "model_dir": str(engine.model_dir),
                "registry": str(engine.kernels.registry.path) if engine.kernels.registry is not None else None}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        # max_model_len: the most tokens (prompt + output) one request can have, as add_request enforces.
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "kernelloop",
                                            "max_model_len": engine.max_model_len} for name in names]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        model_name = check_model(body.model)
        prompt = body.prompt_text_or_ids()
        ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        params = sampling(body, body.logprobs)
        rid, queue = await start(ids, params, body.stream)
        cid = new_id("cmpl")
        want_usage = body.stream_options is not None and body.stream_options.include_usage
        if body.stream:
            offset = [0]  # text_offset continues across chunks, from the start of the completion

            def chunk(out: StepOutput):
                logprobs = None
                if params.logprobs is not None:
                    logprobs = completion_logprobs([lp for lp in out.logprobs if lp is not None], token_text, offset[0])
                    offset[0] = next_text_offset(logprobs, offset[0])
                return completion_body(cid, model_name, out.text, out.finish_reason, logprobs, None)

            def final(tokens: int):
                return {**completion_body(cid, model_name, "", None, None, usage(len(ids), tokens)), "choices": []} if want_usage else None

            return StreamingResponse(stream(rid, queue, chunk, final), media_type="text/event-stream")
        text, lps, finish, tokens = await collect(rid, queue)
        logprobs = completion_logprobs(lps, token_text, 0) if params.logprobs is not None else None
        return completion_body(cid, model_name, text, finish, logprobs, usage(len(ids), tokens))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        model_name = check_model(body.model)
        messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in body.messages]
        try:
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        params = sampling(body, body.logprob_count())
        rid, queue = await start(ids, params, body.stream)
        cid = new_id("chatcmpl")
        want_usage = body.stream_options is not None and body.stream_options.include_usage
        if body.stream:
            first = [True]

            def chunk(out: StepOutput):
                delta: dict[str, Any] = {"role": "assistant", "content": out.text} if first[0] else {"content": out.text}
                first[0] = False
                lps = [lp for lp in out.logprobs if lp is not None]
                return chat_chunk(cid, model_name, delta, out.finish_reason,
                                  chat_logprobs(lps, token_text, token_bytes) if params.logprobs is not None else None)

            def final(tokens: int):
                return chat_chunk(cid, model_name, {}, None, usage_=usage(len(ids), tokens), choices=False) if want_usage else None

            return StreamingResponse(stream(rid, queue, chunk, final), media_type="text/event-stream")
        text, lps, finish, tokens = await collect(rid, queue)
        logprobs = chat_logprobs(lps, token_text, token_bytes) if params.logprobs is not None else None
        return chat_body(cid, model_name, text, finish, logprobs, usage(len(ids), tokens))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        snapshot = await loop.call(lambda: render_metrics(loop))
        return PlainTextResponse(snapshot, media_type="text/plain; version=0.0.4")

    @app.post("/kernels/reload")
    async def reload() -> dict[str, Any]:
        changed = await loop.call(engine.reload_kernels)
        return {"changed": changed, "registry_error": engine.kernels.registry_error}

    @app.post("/gate/measure")
    async def gate_measure(body: dict[str, Any]) -> dict[str, Any]:
        return await gate_endpoint.measure(loop, gate_lock, body)

    @app.post("/profile/start")
    async def profile_start() -> dict[str, Any]:
        return await loop.call(profiler.start)

    @app.post("/profile/stop")
    async def profile_stop() -> dict[str, Any]:
        return await loop.call(profiler.stop)

    return app
