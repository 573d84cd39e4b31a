"""The LLM proposer: asks an OpenAI-compatible chat endpoint for candidate kernels.

One conversation per `propose()` call: the task (agent/proposers/prompts.py), then for each earlier
answer of this proposer in this tune run an assistant turn with it and a user turn with its verdict:
the sandbox's, or the proposal verdict of an answer that never reached the sandbox. `n` candidates are
asked for as `n` choices; a server that ignores `n` is asked again until `n` choices came back (or the
budget ran out).

A weak model's unusable answers (no code block, cut off by max_tokens, an unfinished code block) are
not candidates: `propose()` returns the candidates and leaves each unusable answer, with its proposal
verdict (feedback.proposal_verdict), in `rejected`; the tune loop records both in history and passes
both back as feedback. A model whose context window cannot hold the full task (the endpoint answers
400 about the prompt's length) gets the compact task (prompts.compact_task_prompt) from then on.

`check_endpoint()` asks `GET {base}/models` once, before a tune run does any work: an unreachable
endpoint or a model it does not serve is one line (LLMEndpointError).

Endpoint trouble (timeouts, connection errors, 5xx/408/429, bodies that are not a completion) is
retried with exponential backoff; after `retries` retries `propose()` returns what it has (usually
[]) and sets `last_error` to one line. Other 4xx answers (401, 404, ...) are not retried. It never
raises for endpoint trouble.
"""
from __future__ import annotations

import ast
import json
import os
import re
import time
from typing import Any

import openai

from kernelloop.agent.proposers.base import Feedback, Proposal, TuneContext
from kernelloop.agent.proposers.feedback import PROPOSAL_STAGE, feedback_text, next_round_text, proposal_verdict
from kernelloop.agent.proposers.prompts import SYSTEM_PROMPT, compact_task_prompt, task_prompt
from kernelloop.common.errors import KernelloopError

__all__ = ["LLMEndpointError", "LLMProposer", "classify_answer", "extract_code", "feedback_text"]

MAX_FEEDBACK_TURNS = 6       # earlier proposals replayed into the conversation (the latest ones)
MAX_ANSWER_EXCERPT = 1500    # characters of an unusable answer replayed as its assistant turn
CHECK_TIMEOUT_S = 10.0       # GET /models before a run
# A 400 about the prompt's length (this engine, vLLM, SGLang, llama.cpp, OpenAI): the compact task may fit.
_CONTEXT_OVERFLOW = re.compile(r"context|too long|longer than|serves at most|maximum .*tokens", re.IGNORECASE)
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


def _parses(code: str) -> str | None:
    """None when `code` parses as Python, else the syntax error as 'line N: message'."""
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # null bytes
        return str(exc)
    except (RecursionError, MemoryError) as exc:  # nesting too deep for the parser: not a usable module
        return f"the parser gave up ({type(exc).__name__})"
    return None


def classify_answer(text: str, finish_reason: str | None, max_tokens: int | None = None,
                    tool_call: bool = False) -> tuple[str | None, str | None, str]:
    """(source, None, "") for an answer holding a module, else (None, failure, reason) with failure one of
    no-code, cut-off, truncated (feedback.PROPOSAL_FAILURES). A closed code block is a module (the
    sandbox judges its syntax and signature); so is an unfenced answer that parses and defines forward."""
    source = extract_code(text)
    if source is not None:
        return source, None, ""
    text = text or ""
    limit = f"max_tokens ({max_tokens})" if max_tokens else "max_tokens"
    fences = re.findall(r"^[ \t]*```", text, re.MULTILINE)
    if len(fences) % 2:  # the last code block was opened and never closed
        opened = re.search(r"```[^\n`]*\r?\n(?![\s\S]*```)([\s\S]*)\Z", text)
        code = opened.group(1) if opened else ""
        if finish_reason == "length":
            return None, "cut-off", (f"cut off by {limit} inside its code block after {len(code.splitlines())} "
                                     "lines of code: the module is incomplete")
        error = _parses(code) if code.strip() else "the block is empty"
        if error is None and "def forward" in code:
            return code.strip("\n") + "\n", None, ""  # the model forgot the closing fence only
        return None, "truncated", (f"the answer ended inside its code block, never closed, and the code is "
                                   f"unfinished ({error or 'no def forward'})")
    if finish_reason == "length":
        return None, "cut-off", f"cut off by {limit} before any code block ({len(text)} characters of text)"
    if not text.strip():
        what = "a submit_kernel call without a usable source" if tool_call else "an empty answer"
        return None, "no-code", f"{what}: no code to judge"
    if "def forward" in text and _parses(text) is None:
        return text.strip("\n") + "\n", None, ""  # a bare module without a fence
    if fences:
        return None, "no-code", "no ```python code block (its fenced blocks hold no def forward)"
    if "def forward" in text:
        return None, "no-code", "code outside a ```python block, mixed with prose: nothing to judge"
    return None, "no-code", f"no code block in {len(text)} characters of text"


class LLMEndpointError(KernelloopError):
    """The endpoint is unreachable, refuses us, or does not serve the model (one line)."""


class _Garbage(Exception):
    """The endpoint answered 200 with something that is not a usable chat completion."""


class _Overflow(Exception):
    """The endpoint refused the prompt as longer than the model's context (HTTP 400)."""


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
        self.rejected: Feedback = []   # the last propose()'s unusable answers and verdicts
        self.compact = False           # True once the endpoint refused the full task as too long
        self.context_tokens: int | None = None  # the model's context window, when /models says
        self._n_supported = True       # False once the server ignored or refused `n`

    def close(self) -> None:
        """Close the HTTP client this proposer built (a client passed in is the caller's)."""
        if self._owns_client and hasattr(self.client, "close"):
            self.client.close()

    def __enter__(self) -> "LLMProposer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the endpoint ---------------------------------------------------------------------------
    def check_endpoint(self) -> str:
        """GET {base}/models: raises LLMEndpointError (one line) when the endpoint cannot be reached or
        does not serve `model`; else returns a line describing it. Sets `context_tokens` when reported."""
        where = f"the LLM endpoint {self.base_url or 'https://api.openai.com/v1'}"
        timeout = min(self.timeout_s, CHECK_TIMEOUT_S)
        try:
            models = list(getattr(self.client.with_options(timeout=timeout, max_retries=0).models.list(), "data", None)
                          or [])
        except openai.APITimeoutError:
            raise LLMEndpointError(f"{where} did not answer GET /models within {timeout:g} s") from None
        except openai.APIConnectionError as exc:
            raise LLMEndpointError(f"{where} is unreachable: {_one_line(exc.__cause__ or exc)}") from None
        except openai.APIStatusError as exc:
            raise LLMEndpointError(f"{where} answered GET /models with HTTP {exc.status_code}: "
                                   f"{_one_line(exc)}") from None
        except (openai.OpenAIError, ValueError, TypeError, AttributeError) as exc:
            raise LLMEndpointError(f"{where} gave no model list: {_one_line(exc)}") from None
        ids = [str(getattr(m, "id", "")) for m in models]
        found = next((m for m in models if getattr(m, "id", None) == self.model), None)
        if found is None:
            served = ", ".join(repr(i) for i in ids[:8]) + (", ..." if len(ids) > 8 else "") or "nothing"
            raise LLMEndpointError(f"{where} does not serve the model {self.model!r} (it serves {served}); "
                                   "pass --llm-model")
        context = getattr(found, "max_model_len", None)  # vLLM, SGLang and `engine serve` report it
        self.context_tokens = context if isinstance(context, int) else None
        return (f"{where} serves {self.model}"
                + (f" ({self.context_tokens}-token context)" if self.context_tokens else ""))

    # -- the conversation ------------------------------------------------------------------------
    def build_messages(self, ctx: TuneContext, feedback: list[tuple[Proposal, dict]]) -> list[dict[str, str]]:
        """System + task, then (assistant answer, user feedback) per earlier answer of this proposer.
        Compact (a small context window): the compact task with the latest answer's verdict folded in."""
        mine = [(p, v.to_json() if hasattr(v, "to_json") else (v or {}))  # a sandbox Verdict or its JSON
                for p, v in feedback if getattr(p, "proposer", None) == self.name][-MAX_FEEDBACK_TURNS:]
        system = {"role": "system", "content": SYSTEM_PROMPT}
        if self.compact:
            task = compact_task_prompt(ctx)
            if mine:
                task += "\n\nYour previous answer: " + feedback_text(mine[-1][1])
            return [system, {"role": "user", "content": task}]
        messages = [system, {"role": "user", "content": task_prompt(ctx)}]
        for proposal, verdict in mine:
            messages.append({"role": "assistant", "content": _answer_turn(proposal, verdict)})
            messages.append({"role": "user", "content": next_round_text(feedback_text(verdict))})
        return messages

    # -- proposing -------------------------------------------------------------------------------
    def _budget_left(self) -> bool:
        if self.tokens_used >= self.token_budget:
            self.last_error = f"token budget exhausted: {self.tokens_used} of {self.token_budget} tokens used"
            return False
        return True

    def propose(self, ctx: TuneContext, feedback: Feedback, n: int) -> list[Proposal]:
        """Up to `n` proposals from one conversation; [] on endpoint trouble or an exhausted budget. The
        round's unusable answers (of the `n` asked for) are left in `rejected` with their verdicts."""
        self.last_error = None
        self.rejected = []
        if n <= 0 or not self._budget_left():
            return []
        messages = self.build_messages(ctx, feedback)
        self.rounds += 1
        round_no = self.rounds
        proposals: list[Proposal] = []
        got = 0
        for _ in range(n):  # one request normally; more only when the server ignores `n`
            if got >= n or not self._budget_left():
                break
            want = n - got if self._n_supported else 1
            response = self._complete(messages, want)
            if response is _Overflow and not self.compact:
                self.compact = True  # from now on: the compact task, for this model's small context
                messages = self.build_messages(ctx, feedback)
                self.last_error = None
                response = self._complete(messages, want)
            if response is _Overflow:
                self.last_error = f"the prompt does not fit the model's context, even compacted: {self.last_error}"
                response = None
            if response is None:
                break
            prompt = messages[-1]["content"]
            choices = list(response.choices)[: n - got]
            if want > 1 and len(choices) < want:
                self._n_supported = False
            tokens_p, tokens_c = self._usage(response, messages)
            share_p, share_c = tokens_p // len(choices), tokens_c // len(choices)
            for choice in choices:
                got += 1
                message = choice.message
                text = getattr(message, "content", None) or ""
                source = _tool_source(message)
                failure, reason = None, ""
                if source is None:
                    tool_call = bool(getattr(message, "tool_calls", None))
                    source, failure, reason = classify_answer(
                        text, getattr(choice, "finish_reason", None), self.max_tokens_per_round, tool_call)
                    if tool_call and not text:
                        text = " ".join(c.function.arguments or "" for c in message.tool_calls
                                        if getattr(c, "function", None) is not None)
                proposal = Proposal(
                    source=source if source is not None else text, proposer=self.name,
                    label=f"llm {self.model} round {round_no} choice {got}", model=self.model, prompt=prompt,
                    tokens_prompt=share_p, tokens_completion=share_c)
                if failure is None:
                    proposals.append(proposal)
                else:
                    self.rejected.append((proposal, proposal_verdict(
                        failure, reason, finish_reason=getattr(choice, "finish_reason", None))))
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

    def _complete(self, messages: list[dict[str, str]], n: int) -> Any:
        """One completion with retries; None (and last_error) when the endpoint would not give one,
        _Overflow when it refused the prompt as too long for the model's context."""
        attempt, reason = 0, "no attempt made"
        n = n if self._n_supported else 1  # a server that refused `n` in an earlier request
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
                if status == 400 and _CONTEXT_OVERFLOW.search(_one_line(exc)):
                    self.last_error = f"HTTP 400: {_one_line(exc)}"
                    return _Overflow
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


def _answer_turn(proposal: Proposal, verdict: dict) -> str:
    """An earlier answer as its assistant turn: a module in its fence, an unusable answer as it was."""
    if verdict.get("stage") == PROPOSAL_STAGE and verdict.get("failure") != "duplicate":
        text = proposal.source.strip() or "(an empty answer)"
        return text if len(text) <= MAX_ANSWER_EXCERPT else text[:MAX_ANSWER_EXCERPT] + " [...]"
    return f"```python\n{proposal.source.rstrip()}\n```"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line[:300]
