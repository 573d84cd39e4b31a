"""What a user would run instead of an op's Triton kernel: the torch call `bench.baselines` times next to it.

- linear: `F.linear` in the input dtype (cuBLAS on CUDA). float32 runs inside `full_precision_matmuls`
  (IEEE float32, as the kernel computes; torch may otherwise be set to TF32).
- extend_attention: `F.scaled_dot_product_attention` per request, on a dense layout gathered
  beforehand (untimed): q [1, Hq, new, D], K/V [1, Hk, prefix + new, D] with `enable_gqa` (or repeated
  to Hq heads where only that avoids torch's math backend, or GQA does not run); a request with a
  prefix uses `causal_lower_right` (token i sees the prefix and new tokens 0..i), one without
  `is_causal=True`. The label names the backend that ran, from the checks torch's own dispatch makes
  (`torch._fused_sdp_choice`; for the lower-right mask `CausalBias`'s order: flash, efficient, else
  a materialized mask).
- every other op: its reference (`spec.reference`), run eagerly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F

from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.spec import OpSpec


@dataclass(frozen=True)
class Counterpart:
    label: str
    call: Callable[[], Any]  # one timed call
    output: Callable[[Any], Any]  # `call()`'s result in the op's output layout (untimed)
    context: Callable[[], ContextManager[Any]] = contextlib.nullcontext  # entered around calls and timing
    checked: bool = True  # False: it is the reference itself, nothing to compare


def counterpart(spec: OpSpec, args: tuple, accept: Callable[[Any], bool] | None = None) -> Counterpart:
    """The torch call for `spec` on `args`. `accept(output)` (e.g. "matches the reference") picks
    among SDPA's layouts: the first that runs and is accepted, else the first that runs."""
    if spec.name == "linear":
        return linear_counterpart(*args)
    if spec.name == "extend_attention":
        return sdpa_counterpart(*args, accept=accept)
    return Counterpart("torch eager (the reference)", lambda: spec.reference(*args), lambda out: out, checked=False)


def linear_counterpart(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Counterpart:
    library = "cuBLAS" if x.device.type == "cuda" else "CPU"
    return Counterpart(f"F.linear ({library})", lambda: F.linear(x, weight, bias), lambda out: out,
                       full_precision_matmuls)


# --- extend_attention against SDPA ---------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    rows: slice  # its rows of q / o
    q: torch.Tensor  # [1, Hq, new, D]
    k: torch.Tensor  # [1, Hk or Hq, prefix + new, D]
    v: torch.Tensor
    prefix: int


def dense_requests(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                   v_buffer: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   kv_indices: torch.Tensor, repeat_kv: bool) -> list[Request]:
    """Each request with new tokens, its prefix gathered from the pool and its new K/V appended."""
    group = q.shape[1] // k.shape[1]
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = []
    for b in range(len(qo) - 1):
        s, e = qo[b], qo[b + 1]
        if e <= s:
            continue
        slots = kv_indices[kvp[b]:kvp[b + 1]]
        keys = torch.cat([k_buffer[slots], k[s:e]]).transpose(0, 1)  # [Hk, prefix + new, D]
        values = torch.cat([v_buffer[slots], v[s:e]]).transpose(0, 1)
        if repeat_kv:  # query head h reads kv head h // group
            keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        out.append(Request(slice(s, e), q[s:e].transpose(0, 1).unsqueeze(0).contiguous(),
                           keys.unsqueeze(0).contiguous(), values.unsqueeze(0).contiguous(), len(slots)))
    return out


def _sdpa(r: Request, scale: float, gqa: bool) -> torch.Tensor:
    if r.prefix == 0:
        return F.scaled_dot_product_attention(r.q, r.k, r.v, is_causal=True, scale=scale, enable_gqa=gqa)
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(r.q.shape[-2], r.k.shape[-2])
    return F.scaled_dot_product_attention(r.q, r.k, r.v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def sdpa_backend(r: Request, scale: float, gqa: bool) -> str:
    """The backend torch dispatches this request's call to: flash, efficient, cudnn or math."""
    from torch.nn.attention import SDPBackend

    def name(choice: int) -> str:
        return SDPBackend(choice).name.removesuffix("_ATTENTION").lower()

    if r.prefix == 0:
        return name(torch._fused_sdp_choice(r.q, r.k, r.v, None, 0.0, True, scale=scale, enable_gqa=gqa))
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    params = SDPAParams(r.q, r.k, r.v, None, 0.0, False, gqa)
    if can_use_flash_attention(params):
        return "flash"
    if can_use_efficient_attention(params):
        return "efficient"
    n, total = r.q.shape[-2], r.k.shape[-2]
    mask = torch.ones(n, total, dtype=torch.bool, device=r.q.device).tril(diagonal=total - n)
    return name(torch._fused_sdp_choice(r.q, r.k, r.v, mask, 0.0, False, scale=scale, enable_gqa=gqa)) + \
        " with a materialized mask"


def sdpa_counterpart(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                     v_buffer: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, sm_scale: float,
                     accept: Callable[[Any], bool] | None = None) -> Counterpart:
    """SDPA with torch's own GQA (`enable_gqa`) or with K/V repeated to every query head, whichever
    torch serves without its math backend (GQA when both do)."""
    shape = q.shape

    def output(outs: list[torch.Tensor], requests: list[Request]) -> torch.Tensor:
        o = torch.zeros(shape, dtype=q.dtype, device=q.device)
        for r, out in zip(requests, outs):
            o[r.rows] = out[0].transpose(0, 1)
        return o

    options = []
    for gqa in (True, False):
        requests = dense_requests(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, repeat_kv=not gqa)
        backends = sorted({sdpa_backend(r, sm_scale, gqa) for r in requests}) or ["none"]
        options.append((any(b.startswith("math") for b in backends), gqa, requests, backends))
    first: Counterpart | None = None
    errors = []
    for _, gqa, requests, backends in sorted(options, key=lambda o: o[0]):  # stable: GQA first among equals

        def call(requests: list[Request] = requests, gqa: bool = gqa) -> list[torch.Tensor]:
            return [_sdpa(r, sm_scale, gqa) for r in requests]

        try:
            result = output(call(), requests)
            if q.device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # this layout has no kernel here: try the next
            errors.append(f"{'GQA' if gqa else 'repeated K/V'}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        label = f"SDPA {', '.join(backends)}; {'GQA' if gqa else 'K/V repeated to every head'}"
        found = Counterpart(label, call, lambda outs, requests=requests: output(outs, requests))
        if accept is None or accept(result):
            return found
        first = first or Counterpart(f"{label} (off the reference)", found.call, found.output)
    if first is None:
        raise RuntimeError("no SDPA layout ran: " + "; ".join(errors))
    return first
