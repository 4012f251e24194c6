"""Descriptive statistics. Percentiles use linear interpolation between order statistics (numpy's
default, Hyndman-Fan type 7), so p50 of [1, 2, 3, 4] is 2.5. Bootstraps are seeded, so the same
data always gives the same interval, and vectorised, so a million values cost one pass."""

from __future__ import annotations

import math
from statistics import fmean

import numpy as np


def _clean(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


# Above this many values numpy selects the order statistics (a partition, not a sort of Python
# floats: ~20x faster at a million); the same type-7 rule, equal to the last bit or within one ulp.
LARGE = 4096


def percentile(values: list[float | None], q: float) -> float | None:
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if len(values) >= LARGE:
        a = np.fromiter((v for v in values if v is not None), dtype=float)
        return float(np.percentile(a, q)) if a.size else None
    xs = sorted(_clean(values))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: list[float | None]) -> float | None:
    xs = _clean(values)
    return fmean(xs) if xs else None


def pct_delta(value: float | None, base: float | None) -> float | None:
    """(value - base) / base in percent; None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base * 100.0


def _boot_means(xs: list[float], n_resamples: int, seed: int, counts: list[int] | None = None) -> np.ndarray:
    """Means of seeded resamples of the multiset ``xs`` (each value ``counts`` times where given),
    drawn in blocks so memory stays bounded whatever the size. The values are taken sorted and
    grouped, so their order does not matter; where few are distinct (pass/fail differences, scores
    on a scale) a resample is a multinomial draw of how often each distinct value comes, the same
    law as drawing every value with replacement, at a cost per distinct value instead of per value."""
    values, inverse = np.unique(np.asarray(xs, dtype=float), return_inverse=True)
    weights = np.ones(len(xs), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    counts_of = np.bincount(inverse.ravel(), weights=weights, minlength=values.size).astype(np.int64)
    n = int(counts_of.sum())
    rng = np.random.default_rng(seed)
    out = np.empty(n_resamples)
    grouped = 4 * values.size <= n
    a = values if grouped else np.repeat(values, counts_of)
    # ~8 MB of draws a block: the draws are one stream however it is cut, so the means are the same
    block = max(1, min(n_resamples, 1_000_000 // max(1, a.size)))
    for s in range(0, n_resamples, block):
        k = min(block, n_resamples - s)
        if grouped:
            out[s:s + k] = rng.multinomial(n, counts_of / n, size=k) @ values / n
        else:
            out[s:s + k] = a[rng.integers(0, a.size, size=(k, a.size))].mean(axis=1)
    return out


def bootstrap_ci(values: list[float | None], *, n_resamples: int = 2000, alpha: float = 0.05,
                 bootstrap_seed: int = 0, counts: list[int] | None = None) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean (seeded) of ``values``, each ``counts`` times where
    given (a query's distinct values and how often each came). Descriptive: verdicts use the
    interval of the test that decides them (`signflip`, `proportions`)."""
    xs = _clean(values) if counts is None else values
    if (len(xs) if counts is None else sum(counts)) < 2:
        return None
    means = np.sort(_boot_means(xs, n_resamples, bootstrap_seed, counts)).tolist()  # type: ignore[arg-type]
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


def bootstrap_se(values: list[float | None], *, n_resamples: int = 2000, bootstrap_seed: int = 0) -> float | None:
    """Standard error of the mean, estimated by the (seeded) bootstrap."""
    xs = _clean(values)
    if len(xs) < 2:
        return None
    return float(np.std(_boot_means(xs, n_resamples, bootstrap_seed), ddof=1))


# two-sided test at 5 % with 80 % power: z(0.975) + z(0.80)
Z_DETECT = 1.959964 + 0.841621


def min_detectable(values: list[float | None], **kw: float) -> float | None:
    """The smallest true mean difference a two-sided 5 % test on these paired differences would
    detect with 80 % power: (z₀.₉₇₅ + z₀.₈₀) × the bootstrap standard error of the mean."""
    se = bootstrap_se(values, **kw)  # type: ignore[arg-type]
    return None if se is None else Z_DETECT * se


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score 95 % interval of a proportion (sensible at 0 or n successes and small n)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def time_weighted_mean(points: list[tuple[float, float]], end: float | None = None) -> float | None:
    """The mean over time of a step series ((time, value) points, each value holding until the
    next point, the last one until ``end``): an idle minute weighs a minute, not one sample."""
    pts = sorted(points)
    if not pts:
        return None
    stop = max(end if end is not None else pts[-1][0], pts[-1][0])
    span = stop - pts[0][0]
    if span <= 0:
        return mean([v for _, v in pts])
    total = sum(v * ((pts[i + 1][0] if i + 1 < len(pts) else stop) - t) for i, (t, v) in enumerate(pts))
    return total / span
