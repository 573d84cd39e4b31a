"""Deterministic serving (`engine serve --deterministic`): only batch-invariant variants.

A variant is batch invariant when a row's (a token's, a request's) output bits do not depend on the
other rows of the call: a request then decodes the same tokens alone, inside any batch and from the
prefix cache. Per op and shape, the dispatcher (kernels/dispatch.py) serves, in this order:

  registry   an entry whose verdict proved it (`batch_invariant` True) and that serves every token
             bucket of those model dims with the same source (`invariant_entry`): a different variant
             per bucket would make the batch size choose the bits. Calls past its judged tokens are
             cut into chunks it was judged at (`chunked`), never sent to another variant.
  baseline   the op's baseline kernel where it is invariant (INVARIANT_BASELINES: one program per row,
             no reduction across rows; tests/test_batch_invariance.py proves each with the probe);
  reference  the torch reference where it is (INVARIANT_REFERENCES, proved the same way);
  rowwise    otherwise the reference computed one row at a time (`rowwise`): linear (MKL/cuBLAS pick
             their blocking by the number of rows) and both attentions (one query row at a time over
             exactly the keys it sees, so a prefill from the prefix cache, a whole prompt and a decode
             step compute a token's attention with the same call). Slow, exact.

Anything but a registry entry is a fallback, shown per op and shape on /metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kernelloop.kernels.device import Fingerprint
from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.registry.entry import Entry, select_entry
from kernelloop.kernels.spec import TOKEN_BUCKETS, OpSpec, shape_in_bucket

# Proved by the probe at its batch sizes (tests/test_batch_invariance.py) and by construction: each row
# is one program (baselines) or one row-wise torch reduction over the last dim (references).
INVARIANT_BASELINES = frozenset({"rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope"})
INVARIANT_REFERENCES = frozenset({"rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope"})
ROWWISE = "rowwise"


def invariant_entry(entries: Sequence[Entry], spec: OpSpec, fingerprint: Fingerprint, dtype: str, bucket: str,
                    scope: str = "") -> Entry | None:
    """The registry entry deterministic mode may serve at `bucket`: batch invariant, and the same source
    at every size of the op's bucketed dims (the other dims as in `bucket`). None otherwise."""
    shape = shape_in_bucket(bucket)
    chosen: Entry | None = None
    for lo in (1,) + tuple(b + 1 for b in TOKEN_BUCKETS):  # the smallest size of every bucket
        sibling = spec.bucket({**shape, **{k: lo for k in spec.bucketed}})
        entry = select_entry(list(entries), spec.name, fingerprint, dtype, sibling, scope)
        if entry is None or entry.batch_invariant is not True or (chosen and entry.sha256 != chosen.sha256):
            return None
        chosen = entry
    return chosen


def chunked(spec: OpSpec, fn: Callable[..., Any], limit: int) -> Callable[..., Any]:
    """`fn` on at most `limit` rows a call: a larger call is cut along its row inputs (`batch_rows`) and
    the outputs joined. An invariant `fn` stays invariant, where handing the rest to another variant would not."""
    rows = [i for i, name in enumerate(spec.arg_names) if name in spec.batch_rows]

    def call(*args: Any) -> Any:
        leading = args[rows[0]].shape[0]
        per = max(1, spec.shape_of(*args)["tokens"] // max(leading, 1))  # rows a leading index holds
        step = max(1, limit // per)
        if leading <= step:
            return fn(*args)
        parts = [fn(*(a[s:s + step] if i in rows else a for i, a in enumerate(args))) for s in range(0, leading, step)]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(outs) for outs in zip(*parts))
        return torch.cat(parts)

    return call if rows else fn


def rowwise(spec: OpSpec) -> Callable[..., Any]:
    """The op's reference, one row at a time (the attentions: one query row at a time), on one CPU thread."""
    fn = {"linear": _linear_rows(spec.reference), "decode_attention": _decode_rows,
          "extend_attention": _extend_rows}.get(spec.name) or _rows(spec)
    return _one_thread(fn)


def _one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with torch's CPU ops on one thread: its many tiny ops would each wake the thread pool (35 ms an op
    on a loaded 2-core machine, 0.1 ms on one thread), and the bits of a CPU BLAS call may follow its thread count."""
    def call(*args: Any) -> Any:
        threads = torch.get_num_threads()
        if threads == 1:
            return fn(*args)
        torch.set_num_threads(1)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(threads)

    return call


def _rows(spec: OpSpec) -> Callable[..., Any]:
    rows = [i for i, name in enumerate(spec.arg_names) if name in spec.batch_rows]

    def call(*args: Any) -> Any:
        parts = [spec.reference(*(a[r:r + 1].clone() if i in rows else a for i, a in enumerate(args)))
                 for r in range(args[rows[0]].shape[0])]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(outs) for outs in zip(*parts))
        return torch.cat(parts)

    return call


def _linear_rows(reference: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.empty(flat.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        for r in range(flat.shape[0]):  # a fresh (aligned) copy of the row: the same GEMV call alone or in a batch
            out[r] = reference(flat[r:r + 1].clone(), weight, bias)[0]
        return out.view(*x.shape[:-1], weight.shape[0])

    return linear


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """One query row q [Hq, D] over keys/values [L, Hk, D] (fresh, contiguous) -> [Hq, D] float32."""
    hq, d = q.shape
    hk = keys.shape[1]
    qg = q.float().reshape(hk, hq // hk, d)
    with full_precision_matmuls():
        scores = torch.bmm(qg, keys.float().permute(1, 2, 0)).mul_(sm_scale)  # [Hk, G, L]
        o = torch.bmm(scores.softmax(dim=-1), values.float().transpose(0, 1))  # [Hk, G, D]
    return o.reshape(hq, d)


def _decode_rows(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor, sm_scale: float) -> torch.Tensor:
    out = torch.zeros_like(q)
    kvp = kv_indptr.tolist()
    for b in range(q.shape[0]):
        slots = kv_indices[kvp[b]:kvp[b + 1]]
        if slots.numel():
            out[b] = _attend(q[b], k_buffer[slots], v_buffer[slots], sm_scale)
    return out


def _extend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 sm_scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        s, n = qo[b], qo[b + 1] - qo[b]
        slots = kv_indices[kvp[b]:kvp[b + 1]]
        keys, values = torch.cat([k_buffer[slots], k[s:s + n]]), torch.cat([v_buffer[slots], v[s:s + n]])
        p = slots.numel()
        for j in range(n):  # new token j sees the prefix and new tokens 0..j: as a decode step would
            out[s + j] = _attend(q[s + j], keys[:p + j + 1].clone(), values[:p + j + 1].clone(), sm_scale)
    return out


def fallback(spec: OpSpec, mode: str) -> tuple[str, Callable[..., Any]]:
    """(name, fn) serving `spec` deterministically without a registry entry, in kernel `mode`."""
    if mode != "reference" and spec.name in INVARIANT_BASELINES:
        return "baseline", spec.forward
    if spec.name in INVARIANT_REFERENCES:
        return "reference", spec.reference
    return ROWWISE, rowwise(spec)

