"""Turn last-position logits into next tokens for a batch of requests.

Semantics (per row, from that row's `SamplingParams`):

- Greedy (temperature 0): `argmax` of the raw logits (ties: lowest id). Consumes no randomness.
- Sampling: scale by 1/temperature, keep the top_k largest (top_k=-1: all), then keep the smallest
  set of most likely tokens whose probability reaches top_p (always at least one), renormalise and
  draw one token.
- Logprobs: always those of the model's unmodified distribution, `log_softmax(raw logits)`, before
  temperature/top-k/top-p (vLLM's default). A request that samples with temperature 0.5 therefore
  gets the model's logprob of the chosen token, not the probability it was drawn with.

Batch independence: the draw is an exponential race, `argmax(probs / E)` with `E_v ~ Exp(1)` i.i.d.,
which picks v with probability probs[v] exactly. Each sampling row fills its own `E` (V values)
from its own generator, so a row's token depends only on its logits, params and generator state,
never on the other rows or their order; every other step is row-wise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernelloop.engine.sampling import SamplingParams


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's logprob and the top-N alternatives, sorted by logprob descending."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SampleOutput:
    """`tokens` [B] int64 on the logits' device; `logprobs[i]` is None unless row i asked for them."""

    tokens: torch.Tensor
    logprobs: list[TokenLogprobs | None]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A request's own generator when it has a seed; None (the global RNG) otherwise."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


class Sampler:
    """Stateless batch sampler; see the module docstring for the semantics."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> SampleOutput:
        """Pick one token per row of `logits` [B, V] (any float dtype; math in float32)."""
        if logits.dim() != 2:
            raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
        batch, _ = logits.shape
        if len(params) != batch or len(generators) != batch:
            raise ValueError(f"got {batch} rows, {len(params)} params and {len(generators)} generators")
        logits = logits.float()
        tokens = logits.argmax(dim=-1)  # greedy rows keep this

        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            sub = [params[i] for i in rows]
            probs = self._filtered_probs(logits[rows], sub)
            drawn = self._race(probs, [generators[i] for i in rows])
            tokens[torch.tensor(rows, device=logits.device)] = drawn
        return SampleOutput(tokens=tokens, logprobs=self._logprobs(logits, tokens, params))

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Probabilities after temperature, top-k and top-p, in vocabulary order. [R, V] float32."""
        rows, vocab = logits.shape
        dev = logits.device
        temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
        # Subtract the row max first so a tiny temperature cannot overflow to inf.
        scaled = (logits - logits.max(dim=-1, keepdim=True).values) / temp[:, None]
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        if all(k == vocab for k in top_k) and all(p >= 1.0 for p in top_p):
            return torch.softmax(scaled, dim=-1)

        # Stable descending sort: among equal logits the lowest id ranks first.
        sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
        ranks = torch.arange(vocab, device=dev)
        k = torch.tensor(top_k, device=dev)
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
        p = torch.tensor(top_p, dtype=torch.float32, device=dev)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of strictly better tokens
        drop = (mass_before >= p[:, None]) & (p[:, None] < 1.0)  # p = 1: keep all (no rounding losses)
        drop[:, 0] = False  # always keep the most likely token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        return torch.empty_like(sorted_probs).scatter_(1, order, sorted_probs)

    @staticmethod
    def _race(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """One draw per row: argmax(probs / E), E ~ Exp(1) from the row's own generator."""
        rows, vocab = probs.shape
        noise = torch.empty_like(probs)
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            idx = torch.tensor(unseeded, device=probs.device)
            noise[idx] = torch.empty(len(unseeded), vocab, device=probs.device).exponential_()
        for i, g in enumerate(generators):
            if g is not None:
                e = torch.empty(vocab, dtype=torch.float32, device=g.device).exponential_(generator=g)
                noise[i] = e.to(probs.device)
        # Exp(1) can round to 0: clamp so a filtered token (prob 0) never becomes 0/0 = NaN.
        noise.clamp_(min=torch.finfo(torch.float32).tiny)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, tokens: torch.Tensor, params: Sequence[SamplingParams]
    ) -> list[TokenLogprobs | None]:
        """log_softmax of the raw logits for the rows that asked: chosen token plus top-N."""
        out: list[TokenLogprobs | None] = [None] * len(params)
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return out
        idx = torch.tensor(rows, device=logits.device)
        logp = torch.log_softmax(logits[idx], dim=-1)
        chosen = logp.gather(1, tokens[idx][:, None]).squeeze(1).tolist()
        n = min(max(params[i].logprobs for i in rows), logp.shape[-1])
        top_val, top_idx = logp.topk(n, dim=-1) if n > 0 else (logp[:, :0], logp[:, :0].long())
        top_val, top_idx = top_val.tolist(), top_idx.tolist()
        chosen_ids = tokens[idx].tolist()
        for j, i in enumerate(rows):
            m = params[i].logprobs
            top = list(zip(top_idx[j][:m], top_val[j][:m]))
            out[i] = TokenLogprobs(token_id=chosen_ids[j], logprob=chosen[j], top=top)
        return out
