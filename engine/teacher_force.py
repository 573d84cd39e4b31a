"""Teacher forcing: what the model (through its engine's kernels) thinks of tokens another engine served.

`served_logprobs(engine, prompt_ids, served_ids)` runs one forward over prompt + served tokens and returns
the log-distribution at every served position: row i is the distribution the i-th served token was drawn
from. The shadow audit calls it on a float32 engine with the reference kernels, so the figures compare
what was served against the reference, not against the kernels that served it. It runs outside the
scheduler: call it from the thread that owns the engine, on an engine serving nothing else (the
agent's LocalEngine).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.engine import Engine


@dataclass(frozen=True)
class TeacherForced:
    logprobs: torch.Tensor  # [len(served), vocab] float32 log-softmax at each served position

    @property
    def greedy(self) -> list[int]:
        """The reference's argmax at each served position."""
        return self.logprobs.argmax(dim=-1).tolist()

    def of(self, token_ids: list[int]) -> list[float]:
        """The reference logprob of `token_ids[i]` at position i."""
        index = torch.tensor(token_ids, dtype=torch.int64).view(-1, 1)
        return self.logprobs.gather(1, index).view(-1).tolist()


def served_logprobs(engine: Engine, prompt_ids: list[int], served_ids: list[int]) -> TeacherForced:
    """One forward over `prompt_ids + served_ids[:-1]`; ValueError when it does not fit the engine."""
    vocab = engine.model_config.vocab_size
    if not prompt_ids or any(not 0 <= t < vocab for t in [*prompt_ids, *served_ids]):
        raise ValueError(f"token ids must be in [0, {vocab}) and the prompt non-empty")
    if not served_ids:
        return TeacherForced(torch.empty(0, vocab))
    ids = [*prompt_ids, *served_ids[:-1]]
    if len(ids) > engine.max_context:
        raise ValueError(f"{len(ids)} tokens do not fit this engine's {engine.max_context}-token context")
    slots = engine.allocator.alloc(len(ids))
    if slots is None:
        engine.cache.evict(len(ids) - engine.allocator.available())
        slots = engine.allocator.alloc(len(ids))
    if slots is None:
        raise ValueError(f"{len(ids)} tokens do not fit this engine's free KV cache")
    try:
        batch = ForwardBatch.build("extend", [ids], [0], [slots], engine.device)
        rows = torch.arange(len(prompt_ids) - 1, len(ids), dtype=torch.int64, device=engine.device)
        batch = dataclasses.replace(batch, last_token_index=rows)  # logits at every served position
        logits = engine.model.forward(batch, engine.pool, engine.kernels)
    finally:
        engine.allocator.free(slots)
    return TeacherForced(torch.log_softmax(logits.float().cpu(), dim=-1))
