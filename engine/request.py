"""A request's state as it moves waiting -> prefilling -> running (decoding) -> finished."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelloop.engine.sampler import TokenLogprobs
from kernelloop.engine.sampling import SamplingParams


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # params.max_tokens clamped to the context window
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    # KV state: row in RequestSlots; its first `cached_len` slots belong to the prefix cache (locked
    # through `prefix_node`), slots up to `computed_len` hold KV this request computed, slots up to
    # `allocated_len` are reserved for the forward in flight.
    row: int | None = None
    prefix_node: Any = None
    cached_len: int = 0
    computed_len: int = 0
    allocated_len: int = 0  # slots written to the row so far (>= computed_len during a forward)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_text: str | None = None  # the stop string that ended it, if any
    arrived_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    retractions: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)
