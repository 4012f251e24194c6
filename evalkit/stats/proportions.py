"""Paired pass rates against a non-zero margin: candidate and baseline graded on the same cases,
the difference of their pass rates Δ = (gains − losses) / n (a gain: the candidate passes where the
baseline failed). Per-case differences are −1, 0 or +1, so a sign-flip test shifted by a margin
is not valid for them (it assumes a symmetry such data cannot have).

Tango's score statistic (Tango 1998) tests Δ = δ with the nuisance parameter at its restricted
maximum likelihood. Its p-value here is exact and unconditional (Chan, Tang, Tang & Chan 2003):
the largest tail probability over every value the nuisance parameter can take under the null, so
the test's error at the margin is at most its level at any sample size. Above ``EXACT_UP_TO``
pairs the normal limit of the same statistic is used. The interval is the hull of the δ values
the test keeps (found by bisection), so it agrees with every decision the test makes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import gammaln, ndtr, xlogy

from .signflip import PairedTest

EXACT_UP_TO = 100
_Q_GRID = 32


def tango_z(g: np.ndarray, l_: np.ndarray, n: int, delta: float) -> np.ndarray:
    """Tango's score statistic for gains g and losses l among n pairs, null Δ = delta (a
    fraction). Large values favour Δ > delta."""
    g, l_ = np.asarray(g, dtype=float), np.asarray(l_, dtype=float)
    a = 2.0 * n
    b = -(g + l_) + (2.0 * n - g + l_) * delta
    c = -l_ * delta * (1.0 - delta)
    q = (-b + np.sqrt(np.maximum(b * b - 4 * a * c, 0.0))) / (2 * a)  # restricted MLE of the loss rate
    var = n * (2 * q + delta - delta * delta)
    num = g - l_ - n * delta
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 1e-12, num / np.sqrt(np.maximum(var, 1e-300)), np.sign(num) * np.inf)
    return np.where((var <= 1e-12) & (num == 0), 0.0, z)


@lru_cache(maxsize=8)
def _outcomes(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (gains, losses, ties) of n pairs and its log multinomial coefficient."""
    g, l_ = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = g + l_ <= n
    g, l_ = g[keep].astype(float), l_[keep].astype(float)
    r = n - g - l_
    return g, l_, r, gammaln(n + 1) - gammaln(g + 1) - gammaln(l_ + 1) - gammaln(r + 1)


class PairedProportions(PairedTest):
    """Δ of two paired pass rates in percentage points (candidate − baseline)."""

    method = "exact unconditional score test of paired pass rates (Tango; Chan et al.)"
    unit_scale = 100.0

    def __init__(self, gains: int, losses: int, n: int) -> None:
        super().__init__(n, 100.0 * (gains - losses) / n if n else None)
        self.gains, self.losses = gains, losses
        self._cache: dict[tuple[float, bool], float] = {}
        if n > EXACT_UP_TO:
            self.method = "asymptotic score test of paired pass rates (Tango)"

    @classmethod
    def from_pairs(cls, cand: list[bool], base: list[bool]) -> PairedProportions:
        gains = sum(1 for c, b in zip(cand, base, strict=True) if c and not b)
        losses = sum(1 for c, b in zip(cand, base, strict=True) if b and not c)
        return cls(gains, losses, len(cand))

    def _tail(self, delta_pp: float, upper: bool) -> float:
        """sup over the nuisance of P(Z ≥ z_obs) (upper) or P(Z ≤ z_obs)."""
        key = (delta_pp, upper)
        if key in self._cache:
            return self._cache[key]
        d = min(max(delta_pp / 100.0, -1.0 + 1e-9), 1.0 - 1e-9)
        n = self.n
        z_obs = float(tango_z(np.array([self.gains]), np.array([self.losses]), n, d)[0])
        if n > EXACT_UP_TO:
            p = float(ndtr(-z_obs) if upper else ndtr(z_obs))
        else:
            g, l_, r, logc = _outcomes(n)
            z = tango_z(g, l_, n, d)
            tol = 1e-9 * max(1.0, abs(z_obs))
            mask = (z >= z_obs - tol) if upper else (z <= z_obs + tol)
            lo, hi = max(0.0, -d), (1.0 - d) / 2.0
            # sum over the tail or one minus the sum over the rest, whichever has fewer outcomes
            inside = mask.sum() <= mask.size / 2
            sel = mask if inside else ~mask
            gs, ls, rs, cs = g[sel], l_[sel], r[sel], logc[sel]

            def tail(qs: np.ndarray) -> np.ndarray:
                logp = cs[None, :] + xlogy(gs, qs[:, None] + d) + xlogy(ls, qs[:, None]) \
                    + xlogy(rs, np.maximum(1.0 - 2 * qs[:, None] - d, 0.0))
                mass = np.exp(logp).sum(axis=1)
                return mass if inside else 1.0 - mass

            qs = np.linspace(lo, hi, _Q_GRID)
            t = tail(qs)
            k = int(np.argmax(t))
            step = (hi - lo) / (_Q_GRID - 1)
            fine = np.linspace(max(lo, qs[k] - step), min(hi, qs[k] + step), 9)  # the largest lies near the best point
            p = float(min(1.0, max(t.max(), tail(fine).max())))
        self._cache[key] = p
        return p

    def p_greater(self, delta: float) -> float:
        return 1.0 if self.n == 0 else self._tail(delta, True)

    def p_less(self, delta: float) -> float:
        return 1.0 if self.n == 0 else self._tail(delta, False)

    def _bounds(self, a: float) -> tuple[float, float] | None:
        est = self.estimate or 0.0

        def edge(f: object, lo: float, hi: float) -> float:
            # f(lo) ≤ a/2 (rejected) and f(hi) > a/2 (kept): close in on the change
            if f(hi) <= a / 2:  # type: ignore[operator]
                return hi
            if f(lo) > a / 2:  # type: ignore[operator]
                return lo
            for _ in range(40):
                mid = (lo + hi) / 2
                if f(mid) > a / 2:  # type: ignore[operator]
                    hi = mid
                else:
                    lo = mid
                if hi - lo < 1e-3:  # a thousandth of a percentage point
                    break
            return hi

        lower = edge(self.p_greater, -100.0, est)
        upper = -edge(lambda x: self.p_less(-x), -100.0, -est)
        return lower, upper

    def min_p(self) -> float:
        if self.n > EXACT_UP_TO:
            return 0.0
        return self.p(0.0) if self.gains + self.losses == 0 else min(self.p(-100.0 + 1e-6), self.p(100.0 - 1e-6))
