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
    return served_logprobs_many(engine, [(prompt_ids, served_ids)])[0]


def served_logprobs_many(engine: Engine, pairs: list[tuple[list[int], list[int]]]) -> list[TeacherForced]:
    """`served_logprobs` of several (prompt ids, served ids) pairs in one forward (one extend batch)."""
    vocab = engine.model_config.vocab_size
    for prompt_ids, served_ids in pairs:
        if not prompt_ids or any(not 0 <= t < vocab for t in [*prompt_ids, *served_ids]):
            raise ValueError(f"token ids must be in [0, {vocab}) and the prompt non-empty")
    todo = [(p, s) for p, s in pairs if s]
    seqs = [[*p, *s[:-1]] for p, s in todo]
    total = sum(map(len, seqs))
    if any(len(ids) > engine.max_context for ids in seqs):
        raise ValueError(f"{max(map(len, seqs))} tokens do not fit this engine's {engine.max_context}-token context")
    slots = engine.allocator.alloc(total) if seqs else None
    if seqs and slots is None:
        engine.cache.evict(total - engine.allocator.available())
        slots = engine.allocator.alloc(total)
    if seqs and slots is None:
        raise ValueError(f"{total} tokens do not fit this engine's free KV cache")
    rows: list[int] = []
    start = 0
    for (prompt_ids, _), ids in zip(todo, seqs):
        rows.extend(range(start + len(prompt_ids) - 1, start + len(ids)))
        start += len(ids)
    try:
        logits = None
        if seqs:
            ends = [sum(map(len, seqs[:i + 1])) for i in range(len(seqs))]
            per_request = [slots[end - len(ids):end] for ids, end in zip(seqs, ends)]
            batch = ForwardBatch.build("extend", seqs, [0] * len(seqs), per_request, engine.device)
            index = torch.tensor(rows, dtype=torch.int64, device=engine.device)
            batch = dataclasses.replace(batch, last_token_index=index)  # logits at every served position
            logits = torch.log_softmax(engine.model.forward(batch, engine.pool, engine.kernels).float().cpu(), dim=-1)
    finally:
        if slots is not None:
            engine.allocator.free(slots)
    out, at = [], 0
    for _, served_ids in pairs:
        out.append(TeacherForced(logits[at:at + len(served_ids)] if served_ids else torch.empty(0, vocab)))
        at += len(served_ids)
    return out
