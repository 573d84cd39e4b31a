"""The intervals the judges use: the median interval (the sandbox's kernel speedup and the end-to-end gate's
tokens/s) and the paired ratio interval (the gate's task accuracy after/before)."""

from __future__ import annotations

import random
from statistics import median

BOOTSTRAP_RESAMPLES = 2000


def median_interval(ratios: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Median of per-round ratios and its 95% bootstrap interval (rounds resampled with replacement).
    With few rounds the interval is close to [min, max]: a claim needs every round behind it."""
    rng = random.Random(seed)
    medians = sorted(median([rng.choice(ratios) for _ in ratios]) for _ in range(BOOTSTRAP_RESAMPLES))
    return median(ratios), medians[int(0.025 * len(medians))], medians[int(0.975 * len(medians)) - 1]


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
