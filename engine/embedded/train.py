"""Training the embedded model: pack tokenized documents into rows, run a fixed Adam schedule.

Reproducible on one machine and torch version: a seeded generator for the weights and the batch
order, and a pinned thread count while training (restored afterwards), so the float sums happen
in the same order each time.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .model import ModelConfig, Params, forward, init_params

# Fixed, not "all cores": the thread count changes the float results. (On a machine whose two
# cores are busy with other work, two threads slow training down a lot: build when it is idle.)
TRAIN_THREADS = 2


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe (changing any field changes the model: bump the recipe version)."""

    steps: int = 440
    batch_size: int = 8  # rows per step; small batches and more steps learn faster per token here
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    grad_clip: float = 1.0
    seed: int = 1234


@dataclass(frozen=True)
class Packed:
    """Documents packed into rows [rows, seq_len]: what the training forward needs."""

    inputs: torch.Tensor  # token ids, pad_id after the last document of a row
    labels: torch.Tensor  # the next token within the same document, else -100
    positions: torch.Tensor  # position within its document: every document starts at 0
    doc_ids: torch.Tensor  # which document of the row a token belongs to (-1: padding)


def pack(docs: list[list[int]], seq_len: int, pad_id: int) -> Packed:
    """Whole documents packed greedily into rows of `seq_len` tokens (longer ones truncated).

    Each document keeps its own positions and, through `doc_ids`, its own attention: a prompt at
    serving time starts at position 0 and sees nothing else, and so does every training document
    (otherwise the model learns to copy answers from an unrelated earlier document).
    """
    rows: list[list[list[int]]] = [[]]
    for doc in docs:
        doc = doc[:seq_len]
        if sum(map(len, rows[-1])) + len(doc) > seq_len:
            rows.append([])
        rows[-1].append(doc)
    shape = (len(rows), seq_len)
    packed = Packed(inputs=torch.full(shape, pad_id, dtype=torch.int64),
                    labels=torch.full(shape, -100, dtype=torch.int64),
                    positions=torch.zeros(shape, dtype=torch.int64),
                    doc_ids=torch.full(shape, -1, dtype=torch.int64))
    for r, row in enumerate(rows):
        at = 0
        for d, doc in enumerate(row):
            n = len(doc)
            tokens = torch.tensor(doc, dtype=torch.int64)
            packed.inputs[r, at:at + n] = tokens
            packed.labels[r, at:at + n - 1] = tokens[1:]
            packed.positions[r, at:at + n] = torch.arange(n)
            packed.doc_ids[r, at:at + n] = d
            at += n
    return packed


def doc_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Attention mask [rows, 1, seq, seq]: causal, and only within the token's own document."""
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(doc_ids.shape[1], doc_ids.shape[1], dtype=torch.bool).tril()
    return (same & causal)[:, None]


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup, then cosine decay from `lr` to `min_lr`."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1 + math.cos(math.pi * progress))


def loss_fn(p: Params, cfg: ModelConfig, data: Packed, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions of `rows`."""
    logits = forward(p, cfg, data.inputs[rows], data.positions[rows], doc_mask(data.doc_ids[rows]))
    labels = data.labels[rows]
    return F.cross_entropy(logits.view(-1, cfg.vocab_size), labels.view(-1), ignore_index=-100)


def train_model(cfg: ModelConfig, tc: TrainConfig, data: Packed,
                log_every_s: float = 3.0) -> tuple[Params, float]:
    """Train from a seeded init for `tc.steps` Adam steps; returns the weights and the final loss.

    The final loss is the mean over the last 10 steps. Progress goes to stderr.
    """
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        gen = torch.Generator().manual_seed(tc.seed)
        params = init_params(cfg, gen)
        for t in params.values():
            t.requires_grad_(True)
        opt = torch.optim.Adam(params.values(), lr=tc.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
        order = torch.randperm(len(data.inputs), generator=gen)
        cursor, recent = 0, []
        start = last_log = time.monotonic()
        for step in range(tc.steps):
            if cursor + tc.batch_size > len(order):  # next epoch, new order
                order, cursor = torch.randperm(len(data.inputs), generator=gen), 0
            rows = order[cursor:cursor + tc.batch_size]
            cursor += tc.batch_size
            for group in opt.param_groups:
                group["lr"] = lr_at(step, tc)
            loss = loss_fn(params, cfg, data, rows)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), tc.grad_clip, foreach=False)
            opt.step()
            recent = (recent + [loss.item()])[-10:]
            now = time.monotonic()
            if now - last_log >= log_every_s or step == tc.steps - 1:
                print(f"kernelloop embedded model: step {step + 1}/{tc.steps} loss {loss.item():.3f} "
                      f"({now - start:.0f} s)", file=sys.stderr, flush=True)
                last_log = now
        return {k: t.detach() for k, t in params.items()}, sum(recent) / len(recent)
    finally:
        torch.set_num_threads(saved_threads)
