"""One proportion with an exact binomial test that inverts into its interval: the flip rate (the
share of cases whose pass/fail changed between two variants, in either direction; Dutta et al.
2024, "Accuracy is not all you need").

For k events in n cases and a hypothesised rate δ (in percentage points, like a pass-rate
margin), the one-sided p-values are the binomial tails P(X ≥ k | δ) and P(X ≤ k | δ); the
two-sided p is twice the smaller (at most 1). The δ values a two-sided test at level a keeps are
exactly the Clopper–Pearson interval at level a (its ends are where a tail equals a/2: the
beta quantiles), so an interval printed at a Holm step's level and the test's decision never
disagree. The test is exact at any n (conservative, as every exact test of a discrete count).
"""

from __future__ import annotations

# scipy.special, not scipy.stats (~45 MB of distributions in every report): binom.sf and beta.ppf are
# betainc and betaincinv, the Boost functions they call; binom.cdf is betaincc (its complement: within
# 1e-13 of it, and not 0 in a far tail where binom.cdf underflowed)
from scipy.special import betainc, betaincc, betaincinv

from .signflip import PairedTest


class FlipRate(PairedTest):
    """A rate in percentage points (k of n cases), tested against any δ; ``margin_pp``: the margin
    it will be judged against (for `min_p`, what these n cases can ever show there)."""

    method = "exact binomial test of the flip rate (Clopper-Pearson interval)"
    unit_scale = 100.0

    def __init__(self, k: int, n: int, margin_pp: float | None = None) -> None:
        if not 0 <= k <= n:
            raise ValueError(f"flips: {k} of {n} cases is not a count")
        super().__init__(n, 100.0 * k / n if n else None)
        self.k = k
        self.margin_pp = margin_pp

    @staticmethod
    def _rate(delta_pp: float) -> float:
        return min(1.0, max(0.0, delta_pp / 100.0))

    def p_greater(self, delta: float) -> float:
        """p of "the rate is at most δ" against "it is larger": P(X ≥ k | δ)."""
        if self.n == 0 or self.k == 0:
            return 1.0
        return float(betainc(self.k, self.n - self.k + 1, self._rate(delta)))  # binom.sf(k - 1, n, p)

    def p_less(self, delta: float) -> float:
        """p of "the rate is at least δ" against "it is smaller": P(X ≤ k | δ)."""
        if self.n == 0 or self.k == self.n:
            return 1.0
        return float(betaincc(self.k + 1, self.n - self.k, self._rate(delta)))  # binom.cdf(k, n, p)

    def _bounds(self, a: float) -> tuple[float, float] | None:
        """Clopper–Pearson at level a, in percentage points."""
        if self.n == 0:
            return None
        k, n = self.k, self.n
        lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a / 2))
        hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - a / 2))
        return 100.0 * lo, 100.0 * hi

    def interval(self, a: float, also: tuple[float, ...] = ()) -> tuple[float, float] | None:
        """A single case bounds a rate too (0 or 1 of 1), unlike a paired mean: n ≥ 1 suffices."""
        iv = self._bounds(a)
        if iv is None:
            return None
        lo, hi = iv
        for d in also:
            if self.p(d) > a:
                lo, hi = min(lo, d), max(hi, d)
        return lo, hi

    def min_p(self) -> float:
        """The smallest two-sided p these n cases can give at the margin (all flipped, or none)."""
        if self.margin_pp is None or self.n == 0:
            return 0.0
        d = self._rate(self.margin_pp)
        return min(1.0, 2.0 * min(d ** self.n, (1.0 - d) ** self.n))


def cases_to_show_below(margin_pp: float, alpha: float = 0.05) -> int:
    """The fewest cases with which a run with no flip at all shows the rate below ``margin_pp``
    (two-sided exact test at ``alpha``): (1 − δ)ⁿ ≤ α/2."""
    import math

    d = min(max(margin_pp / 100.0, 1e-9), 1 - 1e-9)
    return math.ceil(math.log(alpha / 2) / math.log(1.0 - d))
