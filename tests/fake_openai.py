"""A scripted OpenAI-compatible chat server for tests: real HTTP on 127.0.0.1, one thread.

    with FakeOpenAI(["```python\\n...\\n```", 500, "garbage", "sleep:3"]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="x")
        ...
        fake.requests  # every JSON body POSTed to /v1/chat/completions, in order

Each POST to /v1/chat/completions consumes the next action of the script:

- a str: the reply text, wrapped in a proper `chat.completion` with usage (one choice, or as many
  as the request's `n` when the server was built with `honor_n=True`);
- a list of str: one choice per text (whatever `n` says);
- a dict: `{"tool_call": {"name": ..., "arguments": {...}}}` (a tool-call reply),
  `{"text": "...", "finish_reason": "length"}` (one choice ending for that reason: "length" is an
  answer cut by max_tokens), `{"status": 400, "message": "..."}` (that error), or
  `{"choices": [...]}` / `{"raw": "..."}` to send that JSON / body verbatim;
- an int: that HTTP status with an OpenAI-style error body (e.g. 500, 401);
- "garbage": a 200 whose body is not JSON;
- "empty": a 200 completion with no choices;
- "sleep:S": wait S seconds before answering (longer than the client's timeout), then 500.

When the script runs out every further request gets 500 ("script exhausted"). Usage is counted as
len(text) // 4 per side, at least 1, so tests can predict it. GET /v1/models lists `model` only
(with `max_model_len` when given); every path requested, GET or POST, is in `paths`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class FakeOpenAI:
    def __init__(self, script: list[Any], *, model: str = "fake-model", honor_n: bool = False,
                 max_model_len: int | None = None) -> None:
        self.script = list(script)
        self.model = model
        self.max_model_len = max_model_len
        self.honor_n = honor_n
        self.requests: list[dict[str, Any]] = []   # JSON bodies received (a non-JSON body: {"_raw": ...})
        self.paths: list[str] = []
        self.responses: list[dict[str, Any]] = []  # completions sent (JSON), for asserting usage
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "FakeOpenAI":
        handler = self._handler_class()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()  # wakes any "sleep:S" handler
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        assert self._server is not None, "use FakeOpenAI as a context manager"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.script)

    # -- replies ------------------------------------------------------------------------------
    def _next_action(self, body: dict[str, Any]) -> Any:
        with self._lock:
            self.requests.append(body)
            self._counter += 1
            return self.script.pop(0) if self.script else None

    def _completion(self, body: dict[str, Any], choices: list[dict[str, Any]], completion_text: str) -> dict[str, Any]:
        prompt_text = "".join(str(m.get("content") or "") for m in body.get("messages") or [] if isinstance(m, dict))
        prompt_tokens, completion_tokens = _tokens(prompt_text), _tokens(completion_text)
        completion = {
            "id": f"chatcmpl-fake-{self._counter}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
        with self._lock:
            self.responses.append(completion)
        return completion

    def _text_reply(self, body: dict[str, Any], texts: list[str], finish_reason: str = "stop") -> dict[str, Any]:
        choices = [{"index": i, "finish_reason": finish_reason, "logprobs": None,
                    "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)]
        return self._completion(body, choices, "".join(texts))

    def _tool_reply(self, body: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        arguments = call.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_fake_1", "type": "function",
            "function": {"name": call.get("name", "submit_kernel"), "arguments": arguments}}]}
        return self._completion(body, [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                                        "message": message}], arguments)

    def respond(self, body: dict[str, Any]) -> tuple[int, bytes, float]:
        """(status, body bytes, delay seconds) for the next scripted action."""
        action = self._next_action(body)
        n = body.get("n") if isinstance(body.get("n"), int) and body.get("n", 0) > 0 else 1
        if action is None:
            return 500, _error_body(500, "script exhausted"), 0.0
        if isinstance(action, bool):
            raise TypeError("script actions are str, list, dict or int")
        if isinstance(action, int):
            return action, _error_body(action, f"scripted status {action}"), 0.0
        if isinstance(action, list):
            return 200, _json(self._text_reply(body, [str(t) for t in action])), 0.0
        if isinstance(action, dict):
            if "raw" in action:
                return 200, str(action["raw"]).encode(), 0.0
            if "tool_call" in action:
                return 200, _json(self._tool_reply(body, action["tool_call"])), 0.0
            if "status" in action:
                status = int(action["status"])
                return status, _error_body(status, str(action.get("message", ""))), 0.0
            if "text" in action:
                reply = self._text_reply(body, [str(action["text"])], action.get("finish_reason", "stop"))
                return 200, _json(reply), 0.0
            if "choices" in action:
                return 200, _json(self._completion(body, action["choices"], "")), 0.0
            raise ValueError(f"unknown dict action {action!r}")
        if action == "garbage":
            return 200, b'{"id": "chatcmpl-broken", "choices": [{"mess', 0.0
        if action == "empty":
            return 200, _json(self._completion(body, [], "")), 0.0
        if isinstance(action, str) and action.startswith("sleep:"):
            return 500, _error_body(500, "slept past the client's timeout"), float(action.split(":", 1)[1])
        texts = [action] * (n if self.honor_n else 1)
        return 200, _json(self._text_reply(body, texts)), 0.0

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.paths.append(self.path)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, _error_body(404, f"no route {self.path}"))
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                status, payload, delay = fake.respond(body)
                if delay and fake._stop.wait(delay):
                    return  # server closing: drop the connection
                self._send(status, payload)

            def do_GET(self) -> None:  # noqa: N802
                fake.paths.append(self.path)
                if self.path.rstrip("/") == "/v1/models":
                    entry = {"id": fake.model, "object": "model", "created": 0, "owned_by": "fake"}
                    if fake.max_model_len is not None:
                        entry["max_model_len"] = fake.max_model_len
                    self._send(200, _json({"object": "list", "data": [entry]}))
                else:
                    self._send(404, _error_body(404, f"no route {self.path}"))

        return Handler


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _error_body(status: int, message: str) -> bytes:
    return _json({"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                            "code": status}})
