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
