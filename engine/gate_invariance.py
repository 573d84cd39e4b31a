"""The gate's batch-invariance probe: do a prompt's greedy tokens depend on what it is served with?

Each prompt is decoded greedily (EOS ignored) three ways:

    alone   one request, the prefix cache emptied first (engine/radix_cache.py `invalidate`)
    batch   all prompts together with seeded filler requests, `batch` requests in all, the cache emptied first
    hit     one request again, after the batch run left its prompt in the prefix cache

A kernel whose reduction order changes with the number of rows, or with a prefill that starts from
cached KV, makes these differ; the gate (agent/gate.py) compares the three before and after a change.
`probe()` runs it on an engine in this process; engine/gate_endpoint.py's `invariance()` runs the same
plan in a serving engine, beside its live traffic.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelloop.engine.engine import Engine
from kernelloop.engine.sampling import SamplingParams

FILLER_SEED = 0
FILLER_LENGTHS = (6, 40)  # token counts of the filler prompts, drawn in this range


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def fillers(vocab_size: int, n: int, seed: int = FILLER_SEED) -> list[list[int]]:
    """`n` seeded random prompts (other traffic), the same for every call with the same arguments."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = FILLER_LENGTHS
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab_size, (k,), generator=g).tolist() for k in lengths]


def batch_prompts(prompts: list[list[int]], vocab_size: int, batch: int) -> list[list[int]]:
    """The batch run's requests: the prompts first, then fillers up to `batch` requests."""
    return prompts + fillers(vocab_size, max(0, batch - len(prompts)))


def probe(engine: Engine, prompts: list[list[int]], max_tokens: int, batch: int) -> dict[str, Any]:
    """{"alone", "batch", "hit": per prompt its greedy token ids; "cached": prompt tokens the hit run
    took from the prefix cache}, on an engine in this process (nothing else running)."""
    params = greedy(max_tokens)
    alone = []
    for prompt in prompts:
        engine.cache.invalidate()
        alone.append(list(engine.generate([prompt], params)[0].output_ids))
    engine.cache.invalidate()
    batched = engine.generate(batch_prompts(prompts, engine.model_config.vocab_size, batch), params)
    hit, cached = [], []
    for prompt in prompts:
        req = engine.generate([prompt], params)[0]
        hit.append(list(req.output_ids))
        cached.append(req.cached_tokens)
    return {"alone": alone, "batch": [list(r.output_ids) for r in batched[:len(prompts)]], "hit": hit,
            "cached": cached}
