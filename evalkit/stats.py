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
                 bootstrap_seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean (seeded, so the same data gives the same interval)."""
    import random

    xs = [v for v in values if v is not None]
    if len(xs) < 2:
        return None
    rng = random.Random(bootstrap_seed)
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


def bootstrap_se(values: list[float], *, n_resamples: int = 2000, bootstrap_seed: int = 0) -> float | None:
    """Standard error of the mean, estimated by the (seeded) bootstrap."""
    import random

    xs = [v for v in values if v is not None]
    if len(xs) < 2:
        return None
    rng = random.Random(bootstrap_seed)
    n = len(xs)
    means = [sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_resamples)]
    m = fmean(means)
    return math.sqrt(sum((x - m) ** 2 for x in means) / (n_resamples - 1))


# two-sided test at 5 % with 80 % power: z(0.975) + z(0.80)
Z_DETECT = 1.959964 + 0.841621


def min_detectable(values: list[float], **kw: float) -> float | None:
    """The smallest true mean difference a two-sided 5 % test on these paired differences would
    detect with 80 % power: (z₀.₉₇₅ + z₀.₈₀) × the bootstrap standard error of the mean."""
    se = bootstrap_se(values, **kw)  # type: ignore[arg-type]
    return None if se is None else Z_DETECT * se


def sign_flip_p(diffs: list[float], shift: float = 0.0, alternative: str = "two-sided",
                n_resamples: int = 20000, bootstrap_seed: int = 0) -> float | None:
    """p-value of a paired sign-flip (randomization) test of mean(diffs) = shift: under the null
    the differences are symmetric about ``shift``, so each sign is equally likely. Exact (every
    sign pattern) up to 14 pairs, seeded Monte Carlo beyond. Valid at any sample size: with 3
    pairs no two-sided p-value is below 0.25, so 3 pairs can never claim a difference.
    ``alternative``: "two-sided", "greater" (mean > shift) or "less" (mean < shift)."""
    import itertools
    import random

    xs = [v - shift for v in diffs if v is not None]
    n = len(xs)
    if n < 2:
        return None
    obs = sum(xs)
    tol = 1e-12 * max(1.0, sum(abs(x) for x in xs))

    if n <= 14:
        sums = [sum(s * x for s, x in zip(signs, xs, strict=True)) for signs in itertools.product((1, -1), repeat=n)]
    else:
        rng = random.Random(bootstrap_seed)
        sums = [sum(x if rng.random() < 0.5 else -x for x in xs) for _ in range(n_resamples)]
        sums.append(obs)  # the observed pattern is one of the possible ones
    m = len(sums)
    if alternative == "greater":
        return sum(s >= obs - tol for s in sums) / m
    if alternative == "less":
        return sum(s <= obs + tol for s in sums) / m
    return min(1.0, sum(abs(s) >= abs(obs) - tol for s in sums) / m)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (step-down; monotone): rejecting where the adjusted p is
    below alpha keeps the chance of any false rejection in the family at or below alpha."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[index]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        adj = min(1.0, (m - rank) * pvalues[i])  # type: ignore[operator]
        running = max(running, adj)
        out[i] = running
    return out


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score 95 % interval of a proportion (sensible at 0 or n successes and small n)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pairs_for_a_verdict(n_margins: int, alpha: float = 0.05) -> int:
    """The fewest pairs with which any verdict is possible: an exact sign-flip test on n pairs
    cannot go below p = 2^-n (one-sided), and Holm over m margins asks the smallest p to be below
    alpha / m. (6 pairs and 4 margins: 0.016 > 0.0125, so no verdict whatever the data.)"""
    return math.floor(math.log2(max(1, n_margins) / alpha)) + 1
