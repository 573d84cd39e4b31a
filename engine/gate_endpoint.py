"""`POST /gate/measure` and `POST /gate/generate`: the quality gate's measurements, taken inside a serving engine.

Body: {"prompts": [[token ids], ...], "max_tokens": N, "warmup": true}. The prompts are decoded greedily (EOS
ignored) alongside live traffic; the full next-token log-distribution at every generated position is
captured through Engine.logits_hook by engine/gate_measure.py's `LogprobCapture`, the same code that
measures an engine in-process. Reply: {"greedy": [[ids]], "tokens_per_second": x, "vocab": V, "dtype": "float64",
"logprobs": [base64 of float64 [positions, V] per prompt]}. One measurement at a time, after an untimed
warm-up pass unless "warmup" is false (the gate warms each registry commit once, on its first visit). A body of
another shape, or a prompt the engine refuses (ids out of range, longer than it serves), gets 400.

`POST /gate/generate`, body {"prompts": [[ids]], "max_tokens": N (up to 1024), "seeds": [null | int per
prompt]}: the runaway check's long generations (greedy for null, sampled from the seed otherwise; EOS ends
them), reply {"outputs": [[ids]]}. `POST /gate/invariance`, body {"prompts", "max_tokens", "batch"}: the
batch-invariance probe (engine/gate_invariance.py). All take the same lock: one gate measurement at a time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from kernelloop.engine.engine import InvalidRequest
from kernelloop.engine.gate_invariance import batch_prompts, greedy
from kernelloop.engine.gate_measure import WARMUP, LogprobCapture, decode_params, long_params, to_wire
from kernelloop.engine.loop import EngineLoop
from kernelloop.engine.openai_api import APIError
from kernelloop.engine.sampling import SamplingParams

MAX_PROMPTS = 16
MAX_TOKENS = 64
MAX_LONG_TOKENS = 1024  # /gate/generate: the runaway check's long generations
MAX_BATCH = 64          # /gate/invariance: requests in its batch run


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(body: dict) -> list[list[int]]:
    prompts = body.get("prompts")
    if (not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_PROMPTS
            or not all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompts)):
        raise APIError(400, f"prompts: 1 to {MAX_PROMPTS} non-empty lists of token ids", param="prompts")
    return prompts


def check_body(body: Any) -> tuple[list[list[int]], int, bool]:
    """(prompts, max_tokens, warmup) of a request body; APIError(400) naming what is wrong."""
    if not isinstance(body, dict):
        raise APIError(400, 'the body must be a JSON object like {"prompts": [[token ids], ...], "max_tokens": N}')
    prompts, max_tokens = _prompts(body), body.get("max_tokens", 6)
    if not _is_int(max_tokens) or not 0 < max_tokens <= MAX_TOKENS:
        raise APIError(400, f"max_tokens: an integer from 1 to {MAX_TOKENS}", param="max_tokens")
    warmup = body.get("warmup", True)
    if not isinstance(warmup, bool):
        raise APIError(400, "warmup: true or false", param="warmup")
    return prompts, max_tokens, warmup


async def submit_all(loop: EngineLoop, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                     prepare: Callable[[str], None] | None = None) -> list[tuple[str, asyncio.Queue]]:
    """Every prompt submitted (with its own params when given a list), or none: a prompt the engine
    refuses (ids out of range, too long) aborts those already in and is answered with 400."""
    submitted: list[tuple[str, asyncio.Queue]] = []
    each = params if isinstance(params, list) else [params] * len(prompts)
    for i, (prompt, p) in enumerate(zip(prompts, each)):
        try:
            submitted.append(await loop.submit(prompt, p, prepare=prepare, stream=False))
        except InvalidRequest as exc:
            for rid, _ in submitted:
                loop.abort(rid)
            raise APIError(400, f"prompts.{i}: {exc}", param=f"prompts.{i}") from None
    return submitted


async def token_ids(queue: asyncio.Queue) -> list[int]:
    """A submitted request's generated token ids, once it has finished."""
    ids: list[int] = []
    while True:
        out = await queue.get()
        ids += out.token_ids
        if out.finished:
            return ids


async def measure(loop: EngineLoop, lock: asyncio.Lock, body: Any) -> dict[str, Any]:
    prompts, max_tokens, warmup = check_body(body)
    engine = loop.engine
    capture = LogprobCapture()  # only the gate's requests: live traffic shares the batches

    def install() -> None:
        engine.logits_hook = capture

    def remove() -> None:
        engine.logits_hook = None

    async with lock:
        if warmup:  # untimed: a reloaded kernel's first call pays one-time costs (JIT, interpreter rewrite)
            for _, queue in await submit_all(loop, prompts, WARMUP):
                while not (await queue.get()).finished:
                    pass
        await loop.call(install)
        try:
            start = time.perf_counter()
            submitted = await submit_all(loop, prompts, decode_params(max_tokens), prepare=capture.watch)
            greedy = [await token_ids(queue) for _, queue in submitted]
            seconds = time.perf_counter() - start
        finally:
            await loop.call(remove)
    return to_wire(capture.measurement([rid for rid, _ in submitted], greedy, seconds))


def check_generate_body(body: Any) -> tuple[list[list[int]], int, list[int | None]]:
    """(prompts, max_tokens, seeds) of a `POST /gate/generate` body; APIError(400) naming what is wrong."""
    if not isinstance(body, dict):
        raise APIError(400, 'the body must be a JSON object like {"prompts": [[token ids], ...], "max_tokens": N, '
                       '"seeds": [null or an integer per prompt]}')
    prompts, max_tokens, seeds = _prompts(body), body.get("max_tokens"), body.get("seeds")
    if not _is_int(max_tokens) or not 0 < max_tokens <= MAX_LONG_TOKENS:
        raise APIError(400, f"max_tokens: an integer from 1 to {MAX_LONG_TOKENS}", param="max_tokens")
    if not isinstance(seeds, list) or len(seeds) != len(prompts) or not all(s is None or _is_int(s) for s in seeds):
        raise APIError(400, "seeds: one per prompt, null (greedy) or an integer (sampled)", param="seeds")
    return prompts, max_tokens, seeds


async def generate(loop: EngineLoop, lock: asyncio.Lock, body: Any) -> dict[str, Any]:
    """`POST /gate/generate`: the gate's long generations (engine/gate_measure.py long_params), alongside live
    traffic. Reply: {"outputs": [[token ids], ...]} in prompt order."""
    prompts, max_tokens, seeds = check_generate_body(body)
    async with lock:
        submitted = await submit_all(loop, prompts, [long_params(max_tokens, seed) for seed in seeds])
        return {"outputs": [await token_ids(queue) for _, queue in submitted]}


def check_invariance_body(body: Any) -> tuple[list[list[int]], int, int]:
    """(prompts, max_tokens, batch) of a `POST /gate/invariance` body; APIError(400) naming what is wrong."""
    if not isinstance(body, dict):
        raise APIError(400, 'the body must be a JSON object like {"prompts": [[token ids], ...], "max_tokens": N, '
                       '"batch": B}')
    prompts, max_tokens, batch = _prompts(body), body.get("max_tokens"), body.get("batch")
    if not _is_int(max_tokens) or not 0 < max_tokens <= MAX_TOKENS:
        raise APIError(400, f"max_tokens: an integer from 1 to {MAX_TOKENS}", param="max_tokens")
    if not _is_int(batch) or not 0 < batch <= MAX_BATCH:
        raise APIError(400, f"batch: an integer from 1 to {MAX_BATCH}", param="batch")
    return prompts, max_tokens, batch


async def invariance(loop: EngineLoop, lock: asyncio.Lock, body: Any) -> dict[str, Any]:
    """`POST /gate/invariance`: engine/gate_invariance.py's probe, beside live traffic. Reply {"alone",
    "batch", "hit": [[ids]] per prompt, "cached": prompt tokens each hit run took from the prefix cache}."""
    prompts, max_tokens, batch = check_invariance_body(body)
    engine, params = loop.engine, greedy(max_tokens)

    async def one(prompt: list[int]) -> tuple[list[int], int]:
        held: dict[str, Any] = {}
        (_, queue), = await submit_all(loop, [prompt], params, prepare=lambda rid: held.update(req=engine.requests[rid]))
        return await token_ids(queue), held["req"].cached_tokens

    async with lock:
        alone = []
        for prompt in prompts:
            await loop.call(engine.cache.invalidate)
            alone.append((await one(prompt))[0])
        await loop.call(engine.cache.invalidate)
        submitted = await submit_all(loop, batch_prompts(prompts, engine.model_config.vocab_size, batch), params)
        batched = [await token_ids(queue) for _, queue in submitted]
        hits = [await one(prompt) for prompt in prompts]
    return {"alone": alone, "batch": batched[:len(prompts)], "hit": [h for h, _ in hits],
            "cached": [c for _, c in hits]}
