"""Paired sign-flip (randomization) tests that invert exactly into the interval they decide by.

For paired differences d_i and a hypothesised mean difference δ, flipping the signs of the set F
of pairs gives a sum at least the observed one exactly when the mean of d over F is at most δ
(Σ s_i (d_i − δ) ≥ Σ (d_i − δ) ⟺ Σ_F d_i ≤ |F| δ). So the one-sided p-value is

    p_greater(δ) = (1 + #{F ≠ ∅ : mean_F(d) ≤ δ}) / 2ⁿ,

a step function of δ that only grows: the interval of δ values a test at level a keeps is an
interval whose ends are order statistics of the subset means (Hartigan's subset means), and a
verdict read from it can never disagree with the test. A ratio of means (a % margin) works the
same way with subset ratios Σ_F c / Σ_F b: testing mean(c) = (1 + r) mean(b) flips the signs of
c_i − (1 + r) b_i.

Exact (all 2ⁿ patterns) up to 14 pairs; a seeded Monte Carlo set of patterns beyond (the same
patterns for every δ, so monotone too); above ``ASYMPTOTIC_FROM`` pairs the normal limit of the
same statistic, Σx / √Σx², which inverts by a quadratic. The test assumes the differences are
symmetric about their mean under the null; with 3 pairs no two-sided p is below 0.25, so 3 pairs
never claim a difference.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import ndtr, ndtri  # the normal's cdf and quantile (scipy.stats' norm calls them)

EXACT_UP_TO = 14
MC_PATTERNS = 20000
ASYMPTOTIC_FROM = 2000
_BLOCK = 2_000_000  # pattern x pair cells per block: memory stays bounded


@lru_cache(maxsize=16)
def _all_subsets(n: int) -> np.ndarray:
    """Every non-empty subset of n pairs as a 0/1 row."""
    ids = np.arange(1, 2 ** n, dtype=np.int64)
    return ((ids[:, None] >> np.arange(n)) & 1).astype(float)


@lru_cache(maxsize=8)
def _random_subsets(n: int, n_patterns: int, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The seeded random subsets as 0/1 blocks with their sizes: the same for every call with the
    same n and seed, so drawn once (a verdict, a report and a simulation ask for them again and again).
    Kept as bits (`np.packbits`), made doubles a block at a time where used: 20,000 patterns of
    2,000 pairs are 5 MB so (40 MB as bytes, 320 MB as doubles), for as long as the cache holds them."""
    rng = np.random.default_rng(seed)
    block = max(1, _BLOCK // n)
    out = []
    for s in range(0, n_patterns, block):
        m = rng.integers(0, 2, size=(min(block, n_patterns - s), n)).astype(np.int8)
        bits = np.packbits(m, axis=1)
        bits.setflags(write=False)
        out.append((bits, m.sum(axis=1, dtype=float)))
    return tuple(out)


def _subset_sums(columns: np.ndarray, n_patterns: int, seed: int) -> tuple[list[np.ndarray], int, int]:
    """(Σ_F of each column, |F|) per subset F: every non-empty one (exact), or ``n_patterns``
    seeded random ones. Returns the sums, how many patterns are always counted (the observed
    one, plus random ones that flipped nothing) and the total number of patterns."""
    n = columns.shape[0]
    if n <= EXACT_UP_TO:
        m = _all_subsets(n)
        return [m @ columns[:, j] for j in range(columns.shape[1])] + [m.sum(axis=1)], 1, 2 ** n
    out: list[list[np.ndarray]] = [[] for _ in range(columns.shape[1] + 1)]
    for bits, size in _random_subsets(n, n_patterns, seed):
        m = np.unpackbits(bits, axis=1, count=n).astype(float)
        for j in range(columns.shape[1]):
            out[j].append(m @ columns[:, j])
        out[-1].append(size)
    sums = [np.concatenate(x) for x in out]
    empty = int((sums[-1] == 0).sum())
    keep = sums[-1] > 0
    return [x[keep] for x in sums], 1 + empty, n_patterns + 1


class PairedTest:
    """A test of "the true difference equals δ" for one set of paired data: one-sided and
    two-sided p-values at any δ, and the two-sided interval at any level. ``interval(a, also)``
    is the hull of the δ values the test keeps at level a; any value in ``also`` that the test
    keeps is inside it, so a decision read from that interval never contradicts the p-value."""

    method = ""
    unit_scale = 1.0

    def __init__(self, n: int, estimate: float | None) -> None:
        self.n, self.estimate = n, estimate

    def p_greater(self, delta: float) -> float:
        """p of "the difference is at most δ" against "it is larger"."""
        raise NotImplementedError

    def p_less(self, delta: float) -> float:
        """p of "the difference is at least δ" against "it is smaller"."""
        raise NotImplementedError

    def p(self, delta: float) -> float:
        """Two-sided: twice the smaller one-sided p (at most 1)."""
        return min(1.0, 2.0 * min(self.p_greater(delta), self.p_less(delta)))

    def _bounds(self, a: float) -> tuple[float, float] | None:
        raise NotImplementedError

    def interval(self, a: float, also: tuple[float, ...] = ()) -> tuple[float, float] | None:
        """The δ values a two-sided test at level ``a`` keeps (each one-sided test at a/2); None
        when these pairs cannot bound the difference at that level at all."""
        iv = self._bounds(a) if self.n >= 2 else None
        if iv is None or not all(math.isfinite(x) for x in iv):
            return None
        lo, hi = iv
        for d in also:
            if self.p(d) > a:
                lo, hi = min(lo, d), max(hi, d)
        return lo, hi

    def min_p(self) -> float:
        """The smallest two-sided p these pairs can give at all."""
        return 0.0


class _SubsetTest(PairedTest):
    """The randomization form: sorted subset statistics, p-values and bounds from their counts."""

    def __init__(self, n: int, estimate: float | None) -> None:
        super().__init__(n, estimate)
        self._stats = np.empty(0)
        self._always, self._total = 1, 1
        self._asym: tuple[float, ...] | None = None

    def _set_stats(self, stats: np.ndarray, always: int, total: int) -> None:
        self._stats, self._always, self._total = np.sort(stats), always, total

    def p_greater(self, delta: float) -> float:
        if self._asym is not None:
            return float(ndtr(-self._z(delta)))
        return (self._always + int(np.searchsorted(self._stats, delta / self.unit_scale, "right"))) / self._total

    def p_less(self, delta: float) -> float:
        if self._asym is not None:
            return float(ndtr(self._z(delta)))
        below = int(np.searchsorted(self._stats, delta / self.unit_scale, "left"))
        return (self._always + len(self._stats) - below) / self._total

    def _bounds(self, a: float) -> tuple[float, float] | None:
        if self._asym is not None:
            return self._asym_interval(a)
        k = math.floor(a * self._total / 2 - self._always) + 1  # count a kept δ needs on each side
        if k > len(self._stats):
            return None
        lo = -math.inf if k <= 0 else float(self._stats[k - 1]) * self.unit_scale
        hi = math.inf if k <= 0 else float(self._stats[len(self._stats) - k]) * self.unit_scale
        return lo, hi

    def min_p(self) -> float:
        if self._asym is not None:
            return 0.0
        return min(1.0, 2.0 * self._always / self._total)

    def _z(self, delta: float) -> float:
        raise NotImplementedError

    def _asym_interval(self, a: float) -> tuple[float, float]:
        raise NotImplementedError


def _roots(qa: float, qb: float, qc: float) -> tuple[float, float]:
    """The interval where qa x² + qb x + qc ≤ 0 (qa > 0), or everything when it has no roots."""
    disc = qb * qb - 4 * qa * qc
    if qa <= 0 or disc < 0:
        return -math.inf, math.inf
    r = math.sqrt(disc)
    return (-qb - r) / (2 * qa), (-qb + r) / (2 * qa)


class SignFlipMean(_SubsetTest):
    """The mean of paired differences (candidate − baseline) in the metric's own unit."""

    method = "sign-flip test of the mean difference"

    def __init__(self, diffs: list[float], *, n_patterns: int = MC_PATTERNS, seed: int = 0) -> None:
        d = np.asarray([x for x in diffs if x is not None], dtype=float)
        super().__init__(len(d), float(d.mean()) if len(d) else None)
        if len(d) < 2:
            self._set_stats(np.empty(0), 1, 1)
        elif len(d) >= ASYMPTOTIC_FROM:
            self._asym = (float(d.sum()), float((d * d).sum()))
        else:
            (sums, sizes), always, total = _subset_sums(d[:, None], n_patterns, seed)
            self._set_stats(sums / sizes, always, total)

    def _z(self, delta: float) -> float:
        s1, s2 = self._asym  # type: ignore[misc]
        q = s2 - 2 * delta * s1 + self.n * delta * delta
        return 0.0 if q <= 0 else (s1 - self.n * delta) / math.sqrt(q)

    def _asym_interval(self, a: float) -> tuple[float, float]:
        s1, s2 = self._asym  # type: ignore[misc]
        n, z2 = self.n, float(-ndtri(a / 2)) ** 2
        return _roots(n * (n - z2), -2 * s1 * (n - z2), s1 * s1 - z2 * s2)


class SignFlipRatio(_SubsetTest):
    """A ratio of means as a % difference: 100 × (Σ candidate / Σ baseline − 1), paired by case.
    Pairs whose baseline value is not positive cannot take part and are left out."""

    method = "sign-flip test of the ratio of means"
    unit_scale = 100.0

    def __init__(self, cand: list[float], base: list[float], *, n_patterns: int = MC_PATTERNS, seed: int = 0) -> None:
        pairs = [(c, b) for c, b in zip(cand, base, strict=True) if c is not None and b is not None and b > 0]
        c = np.asarray([p[0] for p in pairs], dtype=float)
        b = np.asarray([p[1] for p in pairs], dtype=float)
        super().__init__(len(pairs), 100.0 * (c.sum() / b.sum() - 1.0) if len(pairs) else None)
        if len(pairs) < 2:
            self._set_stats(np.empty(0), 1, 1)
        elif len(pairs) >= ASYMPTOTIC_FROM:
            self._asym = (float(c.sum()), float(b.sum()), float((c * c).sum()), float((c * b).sum()),
                          float((b * b).sum()))
        else:
            (sc, sb, _), always, total = _subset_sums(np.stack([c, b], axis=1), n_patterns, seed)
            self._set_stats(sc / sb - 1.0, always, total)

    def _z(self, delta: float) -> float:
        sc, sb, scc, scb, sbb = self._asym  # type: ignore[misc]
        t = 1.0 + delta / 100.0
        q = scc - 2 * t * scb + t * t * sbb
        return 0.0 if q <= 0 else (sc - t * sb) / math.sqrt(q)

    def _asym_interval(self, a: float) -> tuple[float, float]:
        sc, sb, scc, scb, sbb = self._asym  # type: ignore[misc]
        z2 = float(-ndtri(a / 2)) ** 2
        lo, hi = _roots(sb * sb - z2 * sbb, -2 * (sc * sb - z2 * scb), sc * sc - z2 * scc)
        return 100.0 * (lo - 1.0), 100.0 * (hi - 1.0)


def sign_flip_p(diffs: list[float], shift: float = 0.0, alternative: str = "two-sided") -> float | None:
    """p-value of a paired sign-flip test of mean(diffs) = shift ("two-sided", "greater": the
    mean is above shift, "less")."""
    t = SignFlipMean(diffs)
    if t.n < 2:
        return None
    return {"greater": t.p_greater, "less": t.p_less}.get(alternative, t.p)(shift)
