"""The OpenAI wire format: request bodies (parsed and validated), responses and stream chunks."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernelloop.engine.sampler import TokenLogprobs
from kernelloop.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from kernelloop.engine.engine import StepOutput


class APIError(Exception):
    """Answered as OpenAI-style error JSON with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# -- request bodies ---------------------------------------------------------------------------------

# A lone surrogate can only arrive as a \uD800-\uDFFF escape (UTF-8 cannot encode one): bodies
# without such an escape skip the walk over every value.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
Body = TypeVar("Body", bound=BaseModel)


def parse_body(raw: bytes) -> Any:
    """The JSON value of a request body; APIError(400) for what is not UTF-8 JSON holding text."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise APIError(400, "the JSON body nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"malformed JSON body: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise APIError(400, f"malformed JSON body: {exc}") from None
    where = _lone_surrogate(value) if _SURROGATE_ESCAPE.search(text) else None
    if where is not None:
        raise APIError(400, f"{where or 'body'}: holds a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                            "without its pair), which is not text; send valid Unicode", param=where or None)
    return value


def parse_request(model: type[Body], raw: bytes) -> Body:
    """`raw` parsed and validated as `model`; APIError(400) naming the first bad field."""
    try:
        return model.model_validate(parse_body(raw))
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """The first of pydantic's `errors` as a 400, `param` the field's dotted path."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(400, "malformed JSON body")
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if not where and first.get("type") in ("model_type", "dict_type"):
        return APIError(400, "the body must be a JSON object")
    return APIError(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where or None)


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(value: Any) -> str | None:
    """The dotted path of the first string (or key) in `value` that is not valid Unicode ("" for
    the top level), None if there is none. Iterative: nesting depth is the JSON parser's limit."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str) and not _is_text(item):
            return path
        if isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key}" if path else key
                if not _is_text(key):
                    return path or ""
                stack.append((child, where))
        elif isinstance(item, list):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(item))
    return None


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
    response_format: dict[str, Any] | None = None  # {"type": "json_object" | "json_schema" | "text"}: audited, not enforced

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


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(part.text or "" for part in self.content if part.type == "text")
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


# -- one completion's replies, streamed or whole ----------------------------------------------------

def _logprobs_of(out: "StepOutput") -> list[TokenLogprobs]:
    return [lp for lp in out.logprobs if lp is not None]


class CompletionReply:
    """`/v1/completions` bodies for one request: stream chunks (text_offset continuing across
    them), the usage chunk, or the whole reply."""

    def __init__(self, rid: str, model: str, logprobs: bool, token_text: Callable[[int], str]):
        self.rid, self.model, self.logprobs, self.token_text = rid, model, logprobs, token_text
        self.offset = 0  # where the next chunk's text begins in the completion

    def _logprobs(self, out: "StepOutput", offset: int) -> dict[str, Any] | None:
        return completion_logprobs(_logprobs_of(out), self.token_text, offset) if self.logprobs else None

    def chunk(self, out: "StepOutput") -> dict[str, Any]:
        logprobs = self._logprobs(out, self.offset)
        if logprobs is not None:
            self.offset = next_text_offset(logprobs, self.offset)
        return completion_body(self.rid, self.model, out.text, out.finish_reason, logprobs, None)

    def usage_chunk(self, usage_: dict[str, int]) -> dict[str, Any]:
        return {**completion_body(self.rid, self.model, "", None, None, usage_), "choices": []}

    def whole(self, out: "StepOutput", usage_: dict[str, int]) -> dict[str, Any]:
        return completion_body(self.rid, self.model, out.text, out.finish_reason, self._logprobs(out, 0), usage_)


class ChatReply:
    """`/v1/chat/completions` bodies for one request: stream chunks (the first carries the role),
    the usage chunk, or the whole reply."""

    def __init__(self, rid: str, model: str, logprobs: bool, token_text: Callable[[int], str],
                 token_bytes: Callable[[int], bytes]):
        self.rid, self.model, self.logprobs = rid, model, logprobs
        self.token_text, self.token_bytes = token_text, token_bytes
        self.first = True

    def _logprobs(self, out: "StepOutput") -> dict[str, Any] | None:
        return chat_logprobs(_logprobs_of(out), self.token_text, self.token_bytes) if self.logprobs else None

    def chunk(self, out: "StepOutput") -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": out.text} if self.first else {"content": out.text}
        self.first = False
        return chat_chunk(self.rid, self.model, delta, out.finish_reason, self._logprobs(out))

    def usage_chunk(self, usage_: dict[str, int]) -> dict[str, Any]:
        return chat_chunk(self.rid, self.model, {}, None, usage_=usage_, choices=False)

    def whole(self, out: "StepOutput", usage_: dict[str, int]) -> dict[str, Any]:
        return chat_body(self.rid, self.model, out.text, out.finish_reason, self._logprobs(out), usage_)
