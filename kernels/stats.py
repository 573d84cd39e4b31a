"""The one interval both judges use: the sandbox's kernel speedup and the end-to-end gate's tokens/s."""

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
