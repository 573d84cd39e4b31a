"""Attention over the paged KV pool: the extend_attention op for extend (prefill), decode_attention for decode."""

from __future__ import annotations

import torch

from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.memory import KVPool
from kernelloop.kernels.dispatch import Dispatcher


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch,
              pool: KVPool, kd: Dispatcher, scale: float) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hk, D] for the batch's new tokens -> o [T, Hq, D].

    The new K/V are written to the pool first (later forwards read them there). Decode then
    attends over every token through the pool; extend over the cached prefix through the pool
    and over the new tokens through k and v.
    """
    pool.write(layer, batch.out_slots, k, v)
    if batch.mode == "decode":
        return kd.decode_attention(q, pool.k[layer], pool.v[layer], batch.kv_indptr, batch.kv_indices, scale)
    return kd.extend_attention(q, k, v, pool.k[layer], pool.v[layer], batch.qo_indptr, batch.kv_indptr,
                               batch.kv_indices, scale)
