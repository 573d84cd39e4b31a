"""ForwardBatch: everything one model forward needs, built by the scheduler, read by the model.

A batch is either `extend` (prefill: each request adds one or more tokens after a possibly cached
prefix) or `decode` (each request adds exactly one token). Tokens of all requests are packed along
one axis of length T; per-request data uses the batch order.

`kv_indptr`/`kv_indices` are the pool slots attention reads, as its op takes them: decode reads
every token of a request (the new token's K/V are written to the pool first), extend only the
cached prefix (`extend_attention` reads the new tokens' K/V from the projection). Both are built
on the host, where the request-to-slot table lives, and copied to the device once each.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, Literal

import torch

Mode = Literal["extend", "decode"]


@dataclass
class ForwardBatch:
    mode: Mode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each token in its sequence
    out_slots: torch.Tensor  # [T] int64, KV slot where each new token's K/V is written
    kv_indptr: torch.Tensor  # [B + 1] int32, request b's slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_indices: torch.Tensor  # int64, decode: every token of each request; extend: its cached prefix only
    qo_indptr: torch.Tensor | None  # extend: [B + 1] int32, request b's new tokens are rows qo_indptr[b]:qo_indptr[b+1]
    seq_lens: list[int]  # per request: tokens after this forward (prefix + new)
    extend_lens: list[int]  # per request: new tokens in this forward (1 for decode)
    last_token_index: torch.Tensor  # [B] int64, index in T of each request's last token (logits rows)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @classmethod
    def build(cls, mode: Mode, input_ids: list[list[int]], prefix_lens: list[int],
              slots_per_request: list[torch.Tensor], device: str | torch.device) -> "ForwardBatch":
        """From per-request new token ids, cached prefix lengths and all slots (prefix + new, on the host)."""
        extend_lens = [len(ids) for ids in input_ids]
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        new_ends = list(accumulate(extend_lens))
        if mode == "decode":
            kv_indices = torch.cat(slots_per_request)
            kv_ends = list(accumulate(seq_lens))
            out_slots = kv_indices[torch.tensor(kv_ends) - 1]  # each request's one new token is its last
            kv_indptr, qo_indptr = _indptr(kv_ends), None
        else:
            out_slots = torch.cat([slots[p:] for slots, p in zip(slots_per_request, prefix_lens)])
            kv_indices = torch.cat([slots[:p] for slots, p in zip(slots_per_request, prefix_lens)])
            kv_indptr, qo_indptr = _indptr(accumulate(prefix_lens)), _indptr(new_ends).to(device)
        return cls(
            mode=mode,
            input_ids=torch.tensor([t for ids in input_ids for t in ids], dtype=torch.int64, device=device),
            positions=torch.tensor([i for p, s in zip(prefix_lens, seq_lens) for i in range(p, s)],
                                   dtype=torch.int64, device=device),
            out_slots=out_slots.to(device),
            kv_indptr=kv_indptr.to(device),
            kv_indices=kv_indices.to(device),
            qo_indptr=qo_indptr,
            seq_lens=seq_lens,
            extend_lens=extend_lens,
            last_token_index=torch.tensor([e - 1 for e in new_ends], dtype=torch.int64, device=device),
        )


def _indptr(ends: Iterable[int]) -> torch.Tensor:
    """[B + 1] int32 offsets from per-request cumulative ends."""
    return torch.tensor([0, *ends], dtype=torch.int32)
