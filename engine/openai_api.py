"""The OpenAI wire format: request bodies (validated), responses and stream chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.sampler import TokenLogprobs
from engine.sampling import SamplingParams


class APIError(Exception):
    """Answered as OpenAI-style error JSON with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # extension (vLLM, SGLang)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)  # extension
    ignore_eos: bool = False  # extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self, logprobs: int | None, default_max_tokens: int) -> SamplingParams:
        if self.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=stop,
            stop_token_ids=list(self.stop_token_ids), ignore_eos=self.ignore_eos, logprobs=logprobs,
        )


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    logprobs: int | None = None
    echo: bool = False

    def prompt_text_or_ids(self) -> str | list[int]:
        if self.echo:  # whatever form the prompt takes
            raise APIError(400, "echo is not supported", param="echo")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise APIError(400, "batched prompts are not supported; send one prompt per request", param="prompt")
            return self.prompt[0]
        return self.prompt  # type: ignore[return-value]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None

    def logprob_count(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(items: list[TokenLogprobs], token_text, offset: int) -> dict[str, Any]:
    """The legacy completions `logprobs` object. `text_offset` counts characters from the start of
    the completion: `offset` is where `items` begin (in a stream: the length of the tokens' text
    already sent, see `next_text_offset`)."""
    tokens, offsets = [], []
    for lp in items:
        tokens.append(token_text(lp.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{token_text(t): v for t, v in lp.top} for lp in items],
        "text_offset": offsets,
    }


def next_text_offset(logprobs: dict[str, Any], offset: int) -> int:
    """Where the text offsets of the tokens after a `completion_logprobs(..., offset)` object begin."""
    return offset + sum(len(t) for t in logprobs["tokens"])


def chat_logprobs(items: list[TokenLogprobs], token_text, token_bytes) -> dict[str, Any]:
    """`token_bytes(id)`: the token's own bytes (part of a UTF-8 character for some tokens, where
    `token_text` can only give U+FFFD), see engine.detokenizer.TokenBytes."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": token_text(token_id), "logprob": logprob, "bytes": list(token_bytes(token_id))}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in items]}


def completion_body(rid: str, model: str, text: str, finish: str | None, logprobs: dict | None,
                    usage_: dict | None) -> dict[str, Any]:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def chat_body(rid: str, model: str, text: str, finish: str | None, logprobs: dict | None,
              usage_: dict | None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                         "finish_reason": finish}],
            "usage": usage_}


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None, logprobs: dict | None = None,
               usage_: dict | None = None, choices: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
                            if choices else []}
    if usage_ is not None:
        body["usage"] = usage_
    return body
