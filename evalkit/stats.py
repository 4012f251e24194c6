"""Small, dependency-free statistics. Percentiles use linear interpolation between order
statistics (numpy's default, Hyndman-Fan type 7), so p50 of [1, 2, 3, 4] is 2.5."""

from __future__ import annotations

import math
from statistics import fmean


def percentile(values: list[float], q: float) -> float | None:
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: list[float]) -> float | None:
    xs = [v for v in values if v is not None]
    return fmean(xs) if xs else None


def pct_delta(value: float | None, base: float | None) -> float | None:
    """(value - base) / base in percent; None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base * 100.0


def bootstrap_ci(values: list[float], *, n_resamples: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean (seeded, so the same data gives the same interval)."""
    import random

    xs = [v for v in values if v is not None]
    if len(xs) < 2:
        return None
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_resamples))
    return percentile(means, 100 * alpha / 2), percentile(means, 100 * (1 - alpha / 2))


def verdict(ci: tuple[float, float] | None, above: str, below: str, none: str = "within noise") -> str:
    """Plain words only where the interval excludes 0."""
    if ci is None:
        return "n/a (too few pairs)"
    lo, hi = ci
    if lo > 0:
        return above
    if hi < 0:
        return below
    return none
