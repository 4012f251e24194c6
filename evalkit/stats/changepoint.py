"""One mean shift in a series: the CUSUM test. With S_k the cumulative sum of x_i - mean(x) up to
k, T = max_k |S_k| / (sigma * sqrt(n)) tends, for a series of one mean, to the supremum of a
Brownian bridge, whose tail is Kolmogorov's distribution: P(T > c) = 2 sum_j (-1)^(j-1)
exp(-2 j^2 c^2) (c = 1.36 at 5 %, 1.63 at 1 %); sigma^2 is the series' long-run variance.

sigma comes from successive differences (sum (x_i+1 - x_i)^2 / (2 (n-1))), which a single step
hardly moves (it changes one difference), widened for lag-one autocorrelation as in an AR(1):
a load sampled every second is autocorrelated, and treated as independent a flat AR(1) series
(rho 0.5, 60 points) alarmed in 52 % of trials at a 1 % level. rho is read from the residuals of
the two-segment fit (so the step does not count as correlation), bias-corrected (+ (1 + 3 rho) /
n, Kendall) and clamped to [0, 0.95]; the long-run variance is then sigma_d^2 (1 + rho) / (1 - rho)^2.

Measured false-alarm rates at a 1 % level (tests/test_envload_machine.py simulates two):
independent values 0.4-1 % from 20 to 300 points; AR(1) with rho 0.5: 9 % at 20 points, 4 % at
60, 1.6 % at 120, 1 % at 300; rho 0.8: 22 %, 10 %, 6 %, 1.4 %. Short, strongly correlated series
alarm more than stated, so callers also ask the shift to be large enough to matter and test only
series of some length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def kolmogorov_sf(c: float) -> float:
    """P(sup |Brownian bridge| > c)."""
    if c < 0.2:
        return 1.0  # the series converges slowly here, and the value is 1 to 9 digits
    s = sum((-1) ** (j - 1) * math.exp(-2.0 * j * j * c * c) for j in range(1, 101))
    return min(1.0, max(0.0, 2.0 * s))


@dataclass(frozen=True)
class MeanShift:
    index: int  # the first value after the shift
    before: float  # mean of values[:index]
    after: float  # mean of values[index:]
    statistic: float
    p_value: float
    rho: float = 0.0  # the lag-one autocorrelation the variance was widened for
    n: int = 0  # the series' length

    @property
    def delta(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class CusumSums:
    """What the test reads of a series: its length, the sum of its squared successive differences,
    the split with the largest |S_k| (the first such k) and that |S_k|, the two segments' means,
    and the residuals' sum of squares and of lag-one products. `mean_shift` sums them in Python;
    `Ledger.series_shift` in a query over the ledger's rows."""

    n: int
    diff2: float
    index: int
    cusum: float
    before: float
    after: float
    g0: float
    g1: float

    def shift(self) -> MeanShift | None:
        sigma2 = self.diff2 / (2.0 * (self.n - 1))
        if sigma2 == 0.0:
            return None
        # the residuals' lag-one autocorrelation, bias-corrected (Kendall) and clamped
        r = self.g1 / self.g0 if self.g0 else 0.0
        rho = min(0.95, max(0.0, r + (1.0 + 3.0 * r) / self.n)) if self.g0 else 0.0
        t = self.cusum / math.sqrt(sigma2 * (1.0 + rho) / (1.0 - rho) ** 2 * self.n)
        return MeanShift(self.index, self.before, self.after, round(t, 4), kolmogorov_sf(t), round(rho, 3), self.n)


def mean_shift(values: Sequence[float], min_segment: int = 3) -> MeanShift | None:
    """The most likely single shift in the mean, with its CUSUM p-value; None when the series is
    shorter than two segments of ``min_segment`` or constant. Splits closer to either end than
    ``min_segment`` are not considered (which only makes the test more conservative)."""
    x = [float(v) for v in values]
    n = len(x)
    if n < 2 * max(1, min_segment):
        return None
    diff2 = sum((b - a) ** 2 for a, b in zip(x, x[1:], strict=False))
    if diff2 == 0.0:
        return None
    m = sum(x) / n
    best_k, best, s = 0, -1.0, 0.0
    for k in range(1, n):
        s += x[k - 1] - m
        if min_segment <= k <= n - min_segment and abs(s) > best:
            best_k, best = k, abs(s)
    before, after = sum(x[:best_k]) / best_k, sum(x[best_k:]) / (n - best_k)
    e = [v - before for v in x[:best_k]] + [v - after for v in x[best_k:]]
    g0, g1 = sum(v * v for v in e), sum(e[i] * e[i + 1] for i in range(n - 1))
    return CusumSums(n, diff2, best_k, best, before, after, g0, g1).shift()
