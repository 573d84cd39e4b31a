"""The LLM proposer: asks an OpenAI-compatible chat endpoint for candidate kernels (issue #6).

One conversation per `propose()` call: the task (agent/proposers/prompts.py), then for each earlier
proposal of this proposer in this tune run an assistant turn with its code and a user turn with the
sandbox's feedback. `n` candidates are asked for as `n` choices; a server that ignores `n` is asked
again until `n` choices came back (or the budget ran out).

Endpoint trouble (timeouts, connection errors, 5xx/408/429, bodies that are not a completion) is
retried with exponential backoff; after `retries` retries `propose()` returns what it has (usually
[]) and sets `last_error` to one line. Other 4xx answers (401, 404, ...) are not retried. It never
raises for endpoint trouble.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import openai

from agent.proposers.base import Proposal, TuneContext
from agent.proposers.prompts import SYSTEM_PROMPT, feedback_text, next_round_text, no_code_text, task_prompt

__all__ = ["LLMProposer", "extract_code", "feedback_text"]

MAX_FEEDBACK_TURNS = 6       # earlier proposals replayed into the conversation (the latest ones)
MAX_NO_CODE_EXCERPT = 1500   # characters of a code-less reply replayed as its assistant turn
RETRY_STATUSES = frozenset({408, 409, 429})  # 4xx that mean "try again", like the openai client's own rule

SUBMIT_TOOL = {
    "type": "function",
    "function": {
        "name": "submit_kernel",
        "description": "Submit the complete candidate module (Python source defining forward(...)).",
        "parameters": {
            "type": "object",
            "properties": {"source": {"type": "string", "description": "the complete Python module"}},
            "required": ["source"],
        },
    },
}

_PY_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANY_FENCE = re.compile(r"```[^\n`]*\r?\n(.*?)```", re.DOTALL)


def extract_code(text: str | None) -> str | None:
    """The last fenced ```python block of a reply (else the last fence holding `def forward`), or None."""
    if not text:
        return None
    blocks = _PY_FENCE.findall(text)
    if not blocks:
        blocks = [b for b in _ANY_FENCE.findall(text) if "def forward" in b]
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1].strip("\n") + "\n"


def _tool_source(message: Any) -> str | None:
    for call in getattr(message, "tool_calls", None) or []:
        fn = getattr(call, "function", None)
        if fn is None or getattr(fn, "name", None) != SUBMIT_TOOL["function"]["name"]:
            continue
        try:
            args = json.loads(fn.arguments or "{}")
        except (TypeError, ValueError):
            continue
        source = args.get("source") if isinstance(args, dict) else None
        if isinstance(source, str) and source.strip():
            return source.strip("\n") + "\n"
    return None


class _Garbage(Exception):
    """The endpoint answered 200 with something that is not a usable chat completion."""


@dataclass
class _NoCode:
    reply: str
    finish_reason: str | None


class LLMProposer:
    name = "llm"

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 max_tokens_per_round: int = 8000, token_budget: int = 100_000, retries: int = 3,
                 backoff_s: float = 1.0, timeout_s: float = 120.0, client: Any = None,
                 use_tools: bool = False, temperature: float | None = None) -> None:
        """max_tokens_per_round: the completion cap of each request (`max_tokens`, per choice).
        token_budget: prompt + completion tokens this proposer may spend over its life (a tune run).
        client: an `openai.OpenAI`-like object (tests); else one is built with max_retries=0, since
        retries are ours."""
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.max_tokens_per_round = max_tokens_per_round
        self.token_budget = token_budget
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.use_tools = use_tools
        self.temperature = temperature
        self._owns_client = client is None
        if client is None:
            key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
            client = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=timeout_s, max_retries=0)
        self.client = client
        self.tokens_used = 0           # prompt + completion tokens, all calls
        self.tokens_prompt = 0
        self.tokens_completion = 0
        self.calls = 0                 # HTTP requests sent, retries included
        self.rounds = 0                # propose() calls that sent a conversation
        self.last_error: str | None = None
        self._n_supported = True       # False once the server ignored or refused `n`
        self._no_code: list[_NoCode] = []  # code-less replies of the previous round, told back next round

    def close(self) -> None:
        """Close the HTTP client this proposer built (a client passed in is the caller's)."""
        if self._owns_client and hasattr(self.client, "close"):
            self.client.close()

    def __enter__(self) -> "LLMProposer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the conversation ------------------------------------------------------------------------
    def build_messages(self, ctx: TuneContext, feedback: list[tuple[Proposal, dict]]) -> list[dict[str, str]]:
        """System + task, then (assistant code, user feedback) per earlier proposal of this proposer."""
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task_prompt(ctx)}]
        mine = [(p, v) for p, v in feedback if getattr(p, "proposer", None) == self.name][-MAX_FEEDBACK_TURNS:]
        for proposal, verdict in mine:
            if hasattr(verdict, "to_json"):  # a sandbox.verdict.Verdict rather than its JSON
                verdict = verdict.to_json()
            messages.append({"role": "assistant", "content": f"```python\n{proposal.source.rstrip()}\n```"})
            messages.append({"role": "user", "content": next_round_text(feedback_text(verdict or {}))})
        for missing in self._no_code:
            reply = missing.reply.strip() or "(empty reply)"
            if len(reply) > MAX_NO_CODE_EXCERPT:
                reply = reply[:MAX_NO_CODE_EXCERPT] + " [...]"
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": no_code_text(missing.finish_reason)})
        return messages

    # -- proposing -------------------------------------------------------------------------------
    def _budget_left(self) -> bool:
        if self.tokens_used >= self.token_budget:
            self.last_error = f"token budget exhausted: {self.tokens_used} of {self.token_budget} tokens used"
            return False
        return True

    def propose(self, ctx: TuneContext, feedback: list[tuple[Proposal, dict]], n: int) -> list[Proposal]:
        """Up to `n` proposals from one conversation; [] on endpoint trouble or an exhausted budget."""
        self.last_error = None
        if n <= 0 or not self._budget_left():
            return []
        messages = self.build_messages(ctx, feedback)
        prompt = messages[-1]["content"]
        self.rounds += 1
        round_no = self.rounds
        proposals: list[Proposal] = []
        no_code: list[_NoCode] = []
        got = 0
        for _ in range(n):  # one request normally; more only when the server ignores `n`
            if got >= n or not self._budget_left():
                break
            want = n - got if self._n_supported else 1
            response = self._complete(messages, want)
            if response is None:
                break
            choices = list(response.choices)[: n - got]
            if want > 1 and len(choices) < want:
                self._n_supported = False
            tokens_p, tokens_c = self._usage(response, messages)
            share_p, share_c = tokens_p // len(choices), tokens_c // len(choices)
            for choice in choices:
                got += 1
                message = choice.message
                text = getattr(message, "content", None) or ""
                source = _tool_source(message) or extract_code(text)
                if source is None:
                    no_code.append(_NoCode(text, getattr(choice, "finish_reason", None)))
                    continue
                proposals.append(Proposal(
                    source=source, proposer=self.name, label=f"llm {self.model} round {round_no} choice {got}",
                    model=self.model, prompt=prompt, tokens_prompt=share_p, tokens_completion=share_c))
        self._no_code = no_code
        return proposals

    def _usage(self, response: Any, messages: list[dict[str, str]]) -> tuple[int, int]:
        usage = getattr(response, "usage", None)
        prompt_tokens = getattr(usage, "prompt_tokens", None)
        completion_tokens = getattr(usage, "completion_tokens", None)
        if not isinstance(prompt_tokens, int) or not isinstance(completion_tokens, int):
            # No usage from the server: estimate (4 characters a token) so the budget still binds.
            prompt_tokens = sum(len(m["content"]) for m in messages) // 4
            completion_tokens = sum(len(getattr(c.message, "content", None) or "") for c in response.choices) // 4
        self.tokens_prompt += prompt_tokens
        self.tokens_completion += completion_tokens
        self.tokens_used += prompt_tokens + completion_tokens
        return prompt_tokens, completion_tokens

    def _request(self, messages: list[dict[str, str]], n: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens_per_round}
        if n > 1:
            kwargs["n"] = n
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.use_tools:
            kwargs["tools"] = [SUBMIT_TOOL]
        return kwargs

    def _complete(self, messages: list[dict[str, str]], n: int) -> Any | None:
        """One completion with retries; None (and last_error) when the endpoint would not give one."""
        attempt, reason = 0, "no attempt made"
        while attempt <= self.retries:
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            attempt += 1
            self.calls += 1
            try:
                response = self.client.chat.completions.create(**self._request(messages, n))
                choices = getattr(response, "choices", None)
                if not isinstance(choices, list) or not choices:
                    raise _Garbage("a completion without choices")
                if any(getattr(c, "message", None) is None for c in choices):
                    raise _Garbage("a choice without a message")
                return response
            except openai.APITimeoutError:
                reason = f"request timed out after {self.timeout_s:g} s"
            except openai.APIConnectionError as exc:
                reason = f"connection error: {_one_line(exc)}"
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status == 400 and n > 1 and self._n_supported:
                    # Some servers refuse `n`: ask for one choice per request from now on (no attempt spent).
                    self._n_supported, n, attempt = False, 1, attempt - 1
                    reason = f"HTTP 400 with n>1: {_one_line(exc)}"
                    continue
                if status >= 500 or status in RETRY_STATUSES:
                    reason = f"HTTP {status}: {_one_line(exc)}"
                    continue
                self.last_error = f"HTTP {status} from the endpoint (not retried): {_one_line(exc)}"
                return None
            except (_Garbage, ValueError, TypeError, AttributeError, openai.APIResponseValidationError) as exc:
                reason = f"invalid response: {_one_line(exc)}"
            except openai.OpenAIError as exc:
                self.last_error = f"endpoint error (not retried): {_one_line(exc)}"
                return None
        tries = f"{attempt} attempt{'s' if attempt != 1 else ''}"
        self.last_error = f"{reason} (gave up after {tries})"
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line[:300]
