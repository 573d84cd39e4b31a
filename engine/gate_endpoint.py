"""`POST /gate/measure`: the quality gate's measurement, taken inside a serving engine.

Body: {"prompts": [[token ids], ...], "max_tokens": N}. The prompts are decoded greedily (EOS
ignored) alongside live traffic; the full next-token log-distribution at every generated position is
captured through Engine.logits_hook. Reply: {"greedy": [[ids]], "tokens_per_second": x, "vocab": V,
"logprobs": [base64 of float32 [positions, V] per prompt]}. One measurement at a time.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import torch

from engine.loop import EngineLoop
from engine.openai_api import APIError
from engine.sampling import SamplingParams

MAX_PROMPTS = 16
MAX_TOKENS = 64


async def measure(loop: EngineLoop, lock: asyncio.Lock, body: dict[str, Any]) -> dict[str, Any]:
    prompts, max_tokens = body.get("prompts"), body.get("max_tokens", 6)
    if (not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_PROMPTS
            or not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts)):
        raise APIError(400, f"prompts: 1 to {MAX_PROMPTS} non-empty lists of token ids", param="prompts")
    if not isinstance(max_tokens, int) or not 0 < max_tokens <= MAX_TOKENS:
        raise APIError(400, f"max_tokens: 1 to {MAX_TOKENS}", param="max_tokens")
    engine = loop.engine
    captured: dict[str, list[torch.Tensor]] = {}

    def hook(reqs: list, logits: torch.Tensor) -> None:
        for req, row in zip(reqs, logits):
            if req.rid in captured:
                captured[req.rid].append(torch.log_softmax(row.float(), dim=-1).cpu())

    def install() -> None:
        engine.logits_hook = hook

    def remove() -> None:
        engine.logits_hook = None

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async with lock:
        # Untimed first: a reloaded kernel's first call pays one-time costs (JIT, interpreter rewrite).
        warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        for _, queue in [await loop.submit(p, warm, stream=False) for p in prompts]:
            while not (await queue.get()).finished:
                pass
        await loop.call(install)
        try:
            start = time.perf_counter()
            submitted = [await loop.submit(p, params, prepare=lambda rid: captured.setdefault(rid, []), stream=False)
                         for p in prompts]
            greedy = []
            for rid, queue in submitted:
                ids: list[int] = []
                while True:
                    out = await queue.get()
                    ids += out.token_ids
                    if out.finished:
                        break
                greedy.append(ids)
            seconds = time.perf_counter() - start
        finally:
            await loop.call(remove)
    return {
        "greedy": greedy, "tokens_per_second": sum(map(len, greedy)) / seconds, "vocab": engine.model_config.vocab_size,
        "logprobs": [base64.b64encode(torch.stack(captured[rid]).numpy().tobytes()).decode() for rid, _ in submitted],
    }
