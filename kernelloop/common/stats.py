"""The intervals the judges use: the median interval (the sandbox's kernel speedup and the end-to-end gate's
tokens/s) and the paired ratio interval (the gate's task accuracy after/before)."""

from __future__ import annotations

import random
from math import comb
from statistics import median

BOOTSTRAP_RESAMPLES = 2000


ALPHA = 0.025  # each side of a two-sided 95% interval


def order_rank(n: int, alpha: float = ALPHA) -> tuple[int, float]:
    """(k, miss) of `median_interval` at n ratios: k the largest (at most n // 2, at least 1) with
    miss = P(Binomial(n, 1/2) < k) <= alpha, the chance that x(k) lands above the true median."""
    k, miss = 1, 1 / 2 ** n
    while k < n // 2 and miss + comb(n, k) / 2 ** n <= alpha:
        miss += comb(n, k) / 2 ** n
        k += 1
    return k, miss


def median_interval(ratios: list[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """Median of per-round ratios and its distribution-free interval [x(k), x(n+1-k)] (sorted ratios,
    1-based, k from `order_rank`): each round lands above or below the true median with probability
    1/2, whatever the noise's shape, so each bound misses with at most `alpha` (95% two-sided by
    default). Below 6 rounds no k reaches 95% and the interval is [min, max]; at 7 (the CPU judge) it
    is [min, max] too: a claim needs every round behind it."""
    n, xs = len(ratios), sorted(ratios)
    k = order_rank(n, alpha)[0]
    return median(ratios), xs[k - 1], xs[n - k]


def paired_ratio_interval(before: list[float], after: list[float], seed: int = 0) -> tuple[float, float, float]:
    """mean(after) / mean(before) over paired items (item i scored before and after) and its 95% bootstrap
    interval (items resampled with replacement, the pair kept together). Resamples whose before-mean is 0
    are left out; a `before` that is all 0 gives (1.0, 1.0, 1.0): there was nothing to lose."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} items before, {len(after)} after: the scores must be paired")
    if not any(before):
        return 1.0, 1.0, 1.0
    rng, n = random.Random(seed), len(before)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        b = sum(before[i] for i in picks)
        if b:
            ratios.append(sum(after[i] for i in picks) / b)
    ratios.sort()
    return sum(after) / sum(before), ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]
