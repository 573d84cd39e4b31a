"""KV memory, SGLang's layout with page size 1.

- `KVPool`: per layer, K and V buffers of shape [num_slots, kv_heads, head_dim]; a token's K/V
  live in one slot. Slot 0 is reserved: padded positions (e.g. in CUDA graphs) write there.
- `SlotAllocator`: hands out and takes back slots 1..num_slots-1.
- `RequestSlots`: the request-to-token map, [max_requests, max_context] slot ids per request row.
"""

from __future__ import annotations

import torch

from kernelloop.engine.config import ModelConfig


def slots_for_budget(config: ModelConfig, budget_bytes: int, dtype: torch.dtype) -> int:
    """How many token slots fit in `budget_bytes` of K and V over all layers."""
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize
    return max(0, budget_bytes // per_token)


class KVPool:
    def __init__(self, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: str | torch.device):
        if num_slots < 2:
            raise ValueError(f"KV pool needs at least 2 slots, got {num_slots}")
        shape = (num_slots, config.num_kv_heads, config.head_dim)
        self.num_slots = num_slots
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [tokens, kv_heads, head_dim] into `slots` [tokens]."""
        self.k[layer][slots] = k
        self.v[layer][slots] = v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class SlotAllocator:
    """Free list of KV slots. Slot 0 is never handed out."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = torch.arange(1, num_slots, dtype=torch.int64)
        self._num_free = num_slots - 1

    def available(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """n slots, or None when fewer are free (the caller evicts or retracts, then retries)."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._free[start:self._num_free].clone()
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        if n == 0:
            return
        if self._num_free + n > self.num_slots - 1:
            raise RuntimeError("KV slots freed twice")
        self._free[self._num_free:self._num_free + n] = slots.to(torch.int64)
        self._num_free += n


class RequestSlots:
    """The request-to-token map: row r holds the KV slots of request r's tokens, in order."""

    def __init__(self, max_requests: int, max_context: int, device: str | torch.device = "cpu"):
        self.table = torch.zeros((max_requests, max_context), dtype=torch.int64, device=device)
        self.max_context = max_context
        self._free_rows = list(range(max_requests - 1, -1, -1))

    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start:start + slots.numel()] = slots

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]
