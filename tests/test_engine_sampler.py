"""SamplingParams validation and the batch Sampler: greedy, logprobs, top-k/top-p, seeds, distribution."""

from __future__ import annotations

import math

import pytest
import torch

from kernelloop.engine.sampler import SampleOutput, Sampler, TokenLogprobs, make_generator
from kernelloop.engine.sampling import InvalidSamplingParams, SamplingParams

V = 50


def _logits(batch: int, vocab: int = V, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * scale


def _sample(logits, params, generators=None) -> SampleOutput:
    if generators is None:
        generators = [make_generator(p.seed) for p in params]
    return Sampler().sample(logits, params, generators)


# ---------------------------------------------------------------- SamplingParams


def test_defaults_are_openai_like():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k) == (16, 1.0, 1.0, -1)
    assert p.seed is None and p.stop == () and p.stop_token_ids == () and p.logprobs is None
    assert not p.ignore_eos and not p.greedy
    assert SamplingParams(temperature=0).greedy


def test_containers_normalised_and_frozen():
    p = SamplingParams(stop=["a", "bc"], stop_token_ids=[1, 2])
    assert p.stop == ("a", "bc") and p.stop_token_ids == (1, 2)
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=None).stop == ()
    hash(p)
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", 2.0),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -1),
        ("top_p", float("nan")),
        ("top_k", 0),
        ("top_k", -2),
        ("top_k", 1.5),
        ("seed", 1.5),
        ("seed", "7"),
        ("seed", 2**64),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", [""]),
        ("stop", ["ok", 3]),
        ("stop", 5),
        ("stop_token_ids", [1, -1]),
        ("stop_token_ids", ["1"]),
        ("stop_token_ids", 3),
        ("ignore_eos", 1),
        ("ignore_eos", "yes"),
        ("logprobs", -1),
        ("logprobs", 21),
        ("logprobs", 2.0),
        ("logprobs", True),
    ],
)
def test_invalid_field_is_named(field, value):
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field
    assert field in str(err.value)
    assert isinstance(err.value, ValueError)


def test_valid_edges_accepted():
    SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=1, seed=0, logprobs=0)
    SamplingParams(top_p=1e-9, top_k=-1, seed=-(2**63), logprobs=20, stop=["a", "b", "c", "d"])
    assert SamplingParams(temperature=2).temperature == 2.0
    SamplingParams().validate()


# ---------------------------------------------------------------- greedy and logprobs


def test_greedy_is_argmax_and_ignores_generator():
    logits = _logits(6)
    logits[3, 7] = logits[3, 11] = logits[3].max() + 1.0  # tie: lowest id wins
    params = [SamplingParams(temperature=0)] * 6
    g = torch.Generator().manual_seed(123)
    state = g.get_state()
    out = _sample(logits, params, [g] * 6)
    assert out.tokens.dtype == torch.int64 and out.tokens.shape == (6,)
    assert torch.equal(out.tokens, logits.argmax(dim=-1))
    assert out.tokens[3].item() == 7
    assert torch.equal(g.get_state(), state), "greedy rows must not consume randomness"
    assert out.logprobs == [None] * 6


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_raw_log_softmax(temperature):
    logits = _logits(4, seed=1)
    params = [
        SamplingParams(temperature=temperature, logprobs=5, seed=1),
        SamplingParams(temperature=temperature, seed=2),
        SamplingParams(temperature=temperature, logprobs=0, seed=3, top_k=3),
        SamplingParams(temperature=temperature, logprobs=20, seed=4, top_p=0.5),
    ]
    out = _sample(logits, params)
    ref = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    for i in (0, 2, 3):
        lp = out.logprobs[i]
        assert isinstance(lp, TokenLogprobs)
        tok = out.tokens[i].item()
        assert lp.token_id == tok
        assert lp.logprob == pytest.approx(ref[i, tok].item(), abs=1e-5)
        assert len(lp.top) == params[i].logprobs
        ids = [t for t, _ in lp.top]
        vals = [v for _, v in lp.top]
        assert vals == sorted(vals, reverse=True)
        expected = ref[i].topk(len(ids)).indices.tolist() if ids else []
        assert ids == expected
        for t, v in lp.top:
            assert v == pytest.approx(ref[i, t].item(), abs=1e-5)
    # The chosen token is among the alternatives when it is greedy's choice.
    if temperature == 0:
        assert out.logprobs[0].top[0][0] == out.tokens[0].item()


def test_logprobs_ignore_temperature():
    logits = _logits(1, seed=5)
    a = _sample(logits, [SamplingParams(temperature=0.3, logprobs=3, seed=9)]).logprobs[0]
    b = _sample(logits, [SamplingParams(temperature=1.7, logprobs=3, seed=9)]).logprobs[0]
    assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-6)


def test_top_k_one_and_tiny_top_p_equal_greedy():
    logits = _logits(8, seed=2)
    greedy = logits.argmax(dim=-1)
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"top_k": 1, "top_p": 0.3}):
        for seed in range(5):
            params = [SamplingParams(temperature=1.5, seed=seed * 10 + i, **kw) for i in range(8)]
            assert torch.equal(_sample(logits, params).tokens, greedy), kw
    tied = torch.zeros(1, 64)
    tied[0, [40, 7, 11]] = 5.0  # ties: like argmax, the lowest id is the one kept
    for seed in range(5):
        assert _sample(tied, [SamplingParams(top_k=1, seed=seed)]).tokens.item() == 7
        assert _sample(tied, [SamplingParams(top_p=1e-6, seed=seed)]).tokens.item() == 7


def test_top_k_and_top_p_restrict_support():
    logits = _logits(1, vocab=20, seed=3, scale=1.0)
    order = logits[0].argsort(descending=True, stable=True).tolist()
    probs = torch.softmax(logits[0], -1)[order]
    # smallest prefix whose mass reaches 0.6
    n_p = int((probs.cumsum(0) < 0.6).sum().item()) + 1
    seen_k, seen_p = set(), set()
    for seed in range(400):
        seen_k.add(_sample(logits, [SamplingParams(top_k=3, seed=seed)]).tokens.item())
        seen_p.add(_sample(logits, [SamplingParams(top_p=0.6, seed=seed)]).tokens.item())
    assert seen_k == set(order[:3])
    assert seen_p == set(order[:n_p])


# ---------------------------------------------------------------- seeds and batch independence


def test_same_seed_same_tokens_different_seed_differs():
    logits = _logits(1, vocab=1000, seed=4, scale=0.5)
    runs = [_sample(logits, [SamplingParams(seed=42)]).tokens.item() for _ in range(3)]
    assert len(set(runs)) == 1
    others = {_sample(logits, [SamplingParams(seed=s)]).tokens.item() for s in range(20)}
    assert len(others) > 5


def test_row_result_independent_of_batch_composition():
    logits = _logits(6, vocab=300, seed=6, scale=0.7)
    params = [
        SamplingParams(seed=100),
        SamplingParams(temperature=0),
        SamplingParams(seed=101, top_k=40),
        SamplingParams(seed=102, top_p=0.8, temperature=0.8),
        SamplingParams(),  # unseeded: global RNG
        SamplingParams(seed=103, top_k=10, top_p=0.9, temperature=1.3),
    ]
    seeded = [0, 2, 3, 5]
    alone = {i: _sample(logits[i : i + 1], [params[i]]).tokens.item() for i in seeded}
    full = _sample(logits, params).tokens.tolist()
    perm = [5, 4, 3, 1, 0, 2]
    shuffled = _sample(logits[perm], [params[i] for i in perm]).tokens.tolist()
    for i in seeded:
        assert full[i] == alone[i]
        assert shuffled[perm.index(i)] == alone[i]
    # Successive steps with one generator each: sequences match whatever else is batched.
    gens_a = [make_generator(7)]
    gens_b = [make_generator(8), make_generator(7), None]
    for _ in range(10):
        a = Sampler().sample(logits[2:3], [params[2]], gens_a).tokens.item()
        b = Sampler().sample(logits[[0, 2, 4]], [params[0], params[2], params[4]], gens_b).tokens[1].item()
        assert a == b


def test_generator_state_advances():
    logits = _logits(1, vocab=1000, seed=7, scale=0.3)
    g = make_generator(5)
    draws = [Sampler().sample(logits, [SamplingParams()], [g]).tokens.item() for _ in range(10)]
    assert len(set(draws)) > 1


# ---------------------------------------------------------------- distribution


def _empirical(logits_row: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n draws as one batch of n identical rows, each with its own generator."""
    logits = logits_row.expand(n, -1).contiguous()
    gens = [make_generator(10_000 + i) for i in range(n)]
    tokens = Sampler().sample(logits, [params] * n, gens).tokens
    return torch.bincount(tokens, minlength=logits.shape[-1]).double()


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    expected = probs.double() * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "sampled a token with probability 0"
    stat = (((counts - expected) ** 2)[mask] / expected[mask]).sum().item()
    return stat, int(mask.sum().item()) - 1


def test_temperature_one_matches_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2]])
    counts = _empirical(logits[0], SamplingParams(seed=None), 4000)
    stat, dof = _chi2(counts, torch.softmax(logits[0], -1))
    # dof = 7: the 99.9% quantile of chi-square is 24.3
    assert stat < 24.3, (stat, counts)


def test_top_k_top_p_distribution_is_renormalised():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2]])
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9)
    p = torch.softmax(logits[0] / 0.8, -1)
    order = p.argsort(descending=True)
    keep = order[:5]
    pk = torch.zeros_like(p)
    pk[keep] = p[keep] / p[keep].sum()
    sorted_pk = pk[order]
    n = int((sorted_pk.cumsum(0) - sorted_pk < 0.9).sum().item())
    target = torch.zeros_like(p)
    target[order[:n]] = pk[order[:n]] / pk[order[:n]].sum()
    counts = _empirical(logits[0], params, 4000)
    stat, dof = _chi2(counts, target)
    assert stat < {1: 10.8, 2: 13.8, 3: 16.3, 4: 18.5}[dof], (stat, counts, target)


def test_temperature_sharpens_and_flattens():
    logits = _logits(1, vocab=10, seed=8, scale=1.0)[0]
    top = logits.argmax().item()
    share = {}
    for t in (0.25, 1.0, 4.0):
        counts = _empirical(logits, SamplingParams(temperature=t), 1500)
        share[t] = counts[top].item() / 1500
        expected = torch.softmax(logits / t, -1)[top].item()
        assert abs(share[t] - expected) < 5 * math.sqrt(expected * (1 - expected) / 1500) + 1e-9
    assert share[0.25] > share[1.0] > share[4.0]


def test_tiny_temperature_does_not_overflow():
    logits = _logits(3, seed=9) * 100  # |logits| / 1e-37 overflows float32 without care
    out = _sample(logits, [SamplingParams(temperature=1e-37, seed=i) for i in range(3)])
    assert torch.equal(out.tokens, logits.argmax(-1))


# ---------------------------------------------------------------- dtypes, shapes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits(dtype):
    logits32 = _logits(4, seed=10)
    logits = logits32.to(dtype)
    params = [
        SamplingParams(temperature=0, logprobs=3),
        SamplingParams(seed=1, logprobs=2),
        SamplingParams(seed=2, top_k=5, top_p=0.9),
        SamplingParams(seed=3, temperature=0.5),
    ]
    out = _sample(logits, params)
    assert out.tokens.dtype == torch.int64
    ref = torch.log_softmax(logits.float(), -1)
    assert out.tokens[0].item() == logits.float()[0].argmax().item()
    for i in (0, 1):
        lp = out.logprobs[i]
        assert math.isfinite(lp.logprob)
        assert lp.logprob == pytest.approx(ref[i, lp.token_id].item(), abs=1e-5)
    # Same result as the float32 upcast of the same logits.
    again = _sample(logits.float(), params)
    assert torch.equal(out.tokens, again.tokens)


def test_shape_errors():
    with pytest.raises(ValueError):
        Sampler().sample(torch.zeros(3), [SamplingParams()], [None])
    with pytest.raises(ValueError):
        Sampler().sample(torch.zeros(2, 4), [SamplingParams()], [None])
