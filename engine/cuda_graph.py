"""CUDA graphs for decode: one captured forward per padded batch size, replayed each step.

A decode step launches a few hundred small kernels; replaying a graph removes their CPU launch
cost. Inputs are copied into static buffers; a batch is padded up to the next captured size with
dummy requests that have no KV tokens (their attention output is 0) and write their K/V to the
reserved slot 0. Graphs bake in the kernels dispatch chose, so they are recaptured after a
kernel reload that changed anything. Capture needs a decode forward that never reads a device value
on the host (no `.item()`, `.tolist()`, data-dependent shapes): every op's launcher sizes its grid
and workspaces from shapes only (tests/test_engine_attention.py runs it on meta tensors).
"""

from __future__ import annotations

import bisect
import logging

import torch

from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.memory import KVPool
from kernelloop.engine.models import Model
from kernelloop.kernels.dispatch import Dispatcher

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    def __init__(self, model: Model, pool: KVPool, kernels: Dispatcher, max_batch: int, max_kv_tokens: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES):
        self.model, self.pool, self.kernels = model, pool, kernels
        self.sizes = sorted({b for b in batch_sizes if b <= max_batch} | {max_batch})
        self.max_kv_tokens = max_kv_tokens
        dev = model.device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_slots = torch.zeros(n, dtype=torch.int64, device=dev)
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_kv_tokens, dtype=torch.int64, device=dev)
        self.last = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool_handle = None

    def capture(self) -> None:
        """Capture every batch size, largest first (smaller graphs reuse its memory pool)."""
        self.graphs.clear()
        self.outputs.clear()
        self.pool_handle = torch.cuda.graph_pool_handle()
        self.kv_indptr.zero_()  # every request empty while capturing: nothing real is read
        for bs in reversed(self.sizes):
            batch = self._static_batch(bs)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton compiles, dispatch resolves and caches
                    self.model.forward(batch, self.pool, self.kernels)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool_handle):
                self.outputs[bs] = self.model.forward(batch, self.pool, self.kernels)
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.mode == "decode" and bool(self.graphs) and batch.batch_size <= self.sizes[-1]
                and batch.kv_indices.numel() <= self.max_kv_tokens)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        b = batch.batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, b)]
        self.input_ids[:b].copy_(batch.input_ids)
        self.positions[:b].copy_(batch.positions)
        self.out_slots[:b].copy_(batch.out_slots)
        self.out_slots[b:bs].zero_()  # padding writes to the reserved slot 0
        self.input_ids[b:bs].zero_()
        self.positions[b:bs].zero_()
        total = batch.kv_indices.numel()
        self.kv_indptr[:b + 1].copy_(batch.kv_indptr)
        self.kv_indptr[b + 1:bs + 1].fill_(total)  # padding requests have no tokens
        self.kv_indices[:total].copy_(batch.kv_indices)
        self.graphs[bs].replay()
        return self.outputs[bs][:b]

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode="decode", input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_slots=self.out_slots[:bs], kv_indptr=self.kv_indptr[:bs + 1], kv_indices=self.kv_indices,
            qo_indptr=None, seq_lens=[0] * bs, extend_lens=[1] * bs, last_token_index=self.last[:bs],
        )
