"""Attention over the paged KV pool: SDPA for extend (prefill), the decode_attention op for decode."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.batch import ForwardBatch
from engine.memory import KVPool
from kernels.dispatch import Dispatcher


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch,
              pool: KVPool, kd: Dispatcher, scale: float) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hk, D] for the batch's new tokens -> o [T, Hq, D].

    The new K/V are written to the pool first, so every request attends over its cached prefix
    and its new tokens through the same slots.
    """
    pool.write(layer, batch.out_slots, k, v)
    if batch.mode == "decode":
        return kd.decode_attention(q, pool.k[layer], pool.v[layer], batch.kv_indptr, batch.kv_indices, scale)
    return _extend_attention(q, layer, batch, pool, scale)


def _extend_attention(q: torch.Tensor, layer: int, batch: ForwardBatch, pool: KVPool, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    hq, hk = q.shape[1], pool.k[layer].shape[1]
    indptr = batch.kv_indptr.tolist()
    start = 0
    for b, (seq_len, n_new) in enumerate(zip(batch.seq_lens, batch.extend_lens)):
        slots = batch.kv_indices[indptr[b]:indptr[b + 1]]
        keys = pool.k[layer][slots].transpose(0, 1)  # [Hk, S, D]
        values = pool.v[layer][slots].transpose(0, 1)
        if hq != hk:
            keys = keys.repeat_interleave(hq // hk, dim=0)
            values = values.repeat_interleave(hq // hk, dim=0)
        queries = q[start:start + n_new].transpose(0, 1)  # [Hq, n_new, D]
        prefix = seq_len - n_new
        # Causal with the queries aligned to the end: query i sees keys 0 .. prefix + i.
        mask = torch.arange(seq_len, device=q.device)[None, :] <= (prefix + torch.arange(n_new, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
        out[start:start + n_new] = o.transpose(0, 1)
        start += n_new
    return out
