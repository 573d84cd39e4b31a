"""Continuous batching: which requests run in the next forward, and the KV memory behind them.

Policy (one forward per `schedule()`):
- Prefill first: while requests wait and budgets allow, admit them first-come first-served into
  an extend batch (at most `max_prefill_tokens` new tokens). A prompt longer than `chunk_size`
  is prefilled in chunks, one chunked request at a time; it finishes before the next is admitted.
- Otherwise decode every running request by one token.
- Mixed steps (`mixed`, as SGLang's mixed-chunk mode): a prefill batch also carries every running
  request as a one-token extend row, so an arrival does not stall the running streams; the step's
  tokens (prefill and decode rows) stay within `chunk_size`, so a long prompt is chunked across
  steps while the others decode. When the decode rows find no KV room the prefill runs alone.
- Prefix cache: after each prefill forward (each chunk of a chunked one) the tokens computed so
  far go into the prefix cache and the request holds them through a lock, as SGLang's
  `cache_unfinished_req` does; so requests admitted while it still prefills or decodes share them.
  At finish (or retraction) the decoded tokens follow and the lock is dropped.
- KV memory: slots come from the allocator; when it runs dry, unlocked prefix-cache leaves are
  evicted (LRU); when that is not enough for a decode step, the most recently admitted running
  request is retracted: its KV goes to the prefix cache, it returns to the front of the queue,
  and resumes later from its cached tokens. A request that fits alone therefore always finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from kernelloop.engine.memory import RequestSlots, SlotAllocator
from kernelloop.engine.radix_cache import RadixCache
from kernelloop.engine.request import Request
from kernelloop.kernels.spec import TOKEN_BUDGET


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = 32
    max_prefill_tokens: int = TOKEN_BUDGET  # the most rows any judge checks a kernel at (kernels/spec.py)
    chunk_size: int = 2048
    mixed: bool = False  # prefill chunks ride in the same forward as the running decodes
    admission_window: float = 0.005  # seconds the serving loop holds a new arrival for the rest of its burst; 0: off
    admission_gap: float = 0.001  # ... of which it stops holding once no request arrived or is being read for this long


@dataclass
class ScheduledBatch:
    mode: str  # "extend" | "decode" | "mixed" (extend rows, then the running requests' decode rows)
    requests: list[Request]
    starts: list[int]  # per request: tokens already computed (the prefix of this forward)
    lengths: list[int]  # per request: new tokens in this forward
    samples: list[bool]  # per request: does this forward produce its next token?
    num_extend: int = 0  # mixed: the first this many rows are prefill rows

    def is_prefill(self, i: int) -> bool:
        return self.mode == "extend" or (self.mode == "mixed" and i < self.num_extend)


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: SlotAllocator, rows: RequestSlots, cache: RadixCache):
        self.config = config
        self.allocator = allocator
        self.rows = rows
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None  # the request whose prefill is in progress
        self.stopped: list[Request] = []  # finished by the scheduler itself; the engine reports them

    # -- queue -------------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def schedule(self) -> ScheduledBatch | None:
        mixing = self.config.mixed and bool(self.running)
        budget = max(1, min(self.config.max_prefill_tokens, self.config.chunk_size) - len(self.running)) if mixing else None
        batch = self._schedule_extend(budget)
        if batch is None and self.running:
            return self._schedule_decode()
        if batch is not None and mixing:
            self._add_decode_rows(batch)
        return batch

    # -- after a forward ---------------------------------------------------------------------

    def advance(self, batch: ScheduledBatch) -> None:
        """Record that the batch's KV was computed (a prefill's goes to the prefix cache at once);
        finished prefills start decoding."""
        for i, (req, n, sampled) in enumerate(zip(batch.requests, batch.lengths, batch.samples)):
            req.computed_len += n
            if batch.is_prefill(i):
                self._cache_computed(req)
                if sampled:
                    self.chunked = None if self.chunked is req else self.chunked
                    self.running.append(req)
                else:
                    self.chunked = req

    def finish(self, req: Request, reason: str) -> None:
        """Release a request's KV (its computed tokens go to the prefix cache) and forget it."""
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        if req in self.waiting:
            self.waiting.remove(req)
        self._release(req)

    # -- internals ---------------------------------------------------------------------------

    def _schedule_extend(self, budget: int | None = None) -> ScheduledBatch | None:
        cfg = self.config
        budget = cfg.max_prefill_tokens if budget is None else budget
        batch = ScheduledBatch("extend", [], [], [], [])
        candidates = ([self.chunked] if self.chunked else []) + list(self.waiting)
        for req in candidates:
            if req is not self.chunked and len(self.running) + len(batch.requests) >= cfg.max_running_requests:
                break
            if req.row is None and not self._admit(req):
                break
            remaining = req.seq_len - req.computed_len
            n = min(remaining, budget, cfg.chunk_size)
            slots = self._alloc(n) if n > 0 else None
            if slots is None:
                if req is not self.chunked and req.computed_len == req.cached_len:
                    self._release(req)  # admitted this round but no room: back to waiting as it was
                break
            self.rows.write(req.row, req.computed_len, slots)
            req.allocated_len = req.computed_len + n
            if req is not self.chunked:
                self.waiting.remove(req)
            batch.requests.append(req)
            batch.starts.append(req.computed_len)
            batch.lengths.append(n)
            batch.samples.append(n == remaining)
            budget -= n
            if n < remaining or budget == 0:
                break
        return batch if batch.requests else None

    def _schedule_decode(self) -> ScheduledBatch | None:
        while True:
            slots = self._alloc(len(self.running))
            if slots is not None:
                break
            if len(self.running) == 1:
                # Even alone it does not fit: it has used the whole pool. Stop it here.
                req = self.running[0]
                self.finish(req, "length")
                self.stopped.append(req)
                return None
            self._retract(max(self.running, key=lambda r: r.arrived_at))
        for req, slot in zip(self.running, slots):
            self.rows.write(req.row, req.computed_len, slot.view(1))
            req.allocated_len = req.computed_len + 1
        n = len(self.running)
        return ScheduledBatch("decode", list(self.running), [r.computed_len for r in self.running], [1] * n, [True] * n)

    def _add_decode_rows(self, batch: ScheduledBatch) -> None:
        """Append every running request as a one-token row; without KV room for all of them the
        prefill runs alone (the next decode step retracts as usual)."""
        slots = self._alloc(len(self.running))
        if slots is None:
            return
        batch.mode, batch.num_extend = "mixed", len(batch.requests)
        for req, slot in zip(self.running, slots):
            self.rows.write(req.row, req.computed_len, slot.view(1))
            req.allocated_len = req.computed_len + 1
            batch.requests.append(req)
            batch.starts.append(req.computed_len)
            batch.lengths.append(1)
            batch.samples.append(True)

    def _admit(self, req: Request) -> bool:
        """Give a waiting request a row and its cached prefix (at least one token left to compute)."""
        row = self.rows.alloc()
        if row is None:
            return False
        match = self.cache.match_prefix(req.all_ids[:-1])
        self.cache.lock(match.node)
        req.row, req.prefix_node = row, match.node
        req.cached_len = req.computed_len = req.allocated_len = len(match)
        if not req.output_ids:
            req.cached_tokens = len(match)
        self.rows.write(row, 0, match.slots)
        return True

    def _alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is None:
            self.cache.evict(n - self.allocator.available())
            slots = self.allocator.alloc(n)
        return slots

    def _retract(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.retractions += 1
        self.waiting.appendleft(req)

    def _cache_computed(self, req: Request) -> None:
        """Put the request's computed tokens into the prefix cache now, not only when it finishes.

        Slot ownership: the request owns row[cached_len:computed_len]. The cache takes those it did
        not have yet; the ones it already had (another request cached the same tokens since this one
        was admitted) are freed and the row points at the cache's copies instead. The request then
        holds the whole computed prefix through one lock on the node that ends it (taken before the
        old one is dropped), so `_release` later frees nothing twice and nothing still in use.
        """
        n = req.computed_len
        if self.cache.disabled or n <= req.cached_len:
            return
        tokens = req.all_ids[:n]
        slots = self.rows.read(req.row, n).clone()
        already = self.cache.insert(tokens, slots)
        if already > req.cached_len:
            self.allocator.free(slots[req.cached_len:already])
        match = self.cache.match_prefix(tokens, count=False)
        assert len(match) == n, f"{n} tokens inserted but {len(match)} matched"
        self.cache.lock(match.node)
        self.cache.unlock(req.prefix_node)
        self.rows.write(req.row, 0, match.slots)
        req.prefix_node, req.cached_len = match.node, n

    def _release(self, req: Request) -> None:
        """Computed KV to the prefix cache, duplicates and unused slots freed, lock and row dropped."""
        if req.row is None:
            return
        slots = self.rows.read(req.row, req.allocated_len).clone()
        already = self.cache.insert(req.all_ids[:req.computed_len], slots[:req.computed_len])
        if already > req.cached_len:
            self.allocator.free(slots[req.cached_len:already])  # the cache kept its own copies
        self.allocator.free(slots[req.computed_len:])  # reserved for a forward that never completed
        self.cache.unlock(req.prefix_node)
        self.rows.free(req.row)
        req.row, req.prefix_node = None, None
        req.cached_len = req.computed_len = req.allocated_len = 0
