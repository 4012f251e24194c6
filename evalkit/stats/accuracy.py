"""Accuracy of a candidate against the baseline on the same items: recovery with a paired cluster
bootstrap interval, McNemar's exact test, and the smallest difference a study of n items detects.

**Recovery** = candidate accuracy / baseline accuracy x 100 (100: nothing lost). Its interval is
a paired *cluster* bootstrap: whole clusters (an arithmetic template, an MMLU subject; an item on
its own where there are none) are resampled with replacement and an item's baseline and candidate
answers stay together, so items that share a template and fail together are not counted as
independent evidence. The interval is **BCa** (bias-corrected and accelerated; Efron 1987): the
ratio's sampling distribution is skewed near 100 %, where a percentile interval undercovers; the
acceleration comes from the jackknife over clusters. With few clusters a bootstrap is too narrow
(it treats the K clusters seen as the population), so the normal quantile BCa adjusts is
*expanded* to sqrt(K/(K-1)) t_{K-1} (Hesterberg's expanded percentile interval): in seeded
simulations a 95 % interval then covers about 93 % instead of 92 % at 25 clusters, 94-95 %
instead of 93 % at 40; at 100 clusters it barely changes. Where a jackknife ratio is undefined (a
cluster holds every correct baseline answer) it falls back to the percentile interval, and says
so. A baseline with no correct answer has no recovery (None), never a division by zero; resamples
whose baseline has none are left out and their share reported.

**McNemar's exact test**: under "no difference" each discordant pair (lost: the baseline right
and the candidate wrong; gained: the reverse) is lost or gained with probability 1/2, so the
two-sided p-value is min(1, 2 P(X <= min(lost, gained))) for X ~ Binomial(lost + gained, 1/2);
1 when there is no discordant pair.

**Minimum detectable difference** (for `plan`): Connor's (1987) sample size for McNemar's test,
n = (z_{1-a/2} sqrt(psi) + z_{1-b} sqrt(psi - d^2))^2 / d^2, with psi the discordance (the
share of items the two variants answer differently), d the accuracy difference and 1-b the power,
solved for d at the given n.

numpy and the standard library only; every bootstrap is seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

_N = NormalDist()
EXACT_UP_TO = 1000  # discordant pairs summed as exact integers; above, in log space
# clusters holding a correct baseline answer, at the fewest, for a recovery interval: below it every resample's
# ratio rests on the same one or two successes and the bootstrap shows no spread it does not have ([0, 0])
MIN_RIGHT_CLUSTERS = 5


@dataclass(frozen=True)
class Recovery:
    """Candidate accuracy as a percentage of the baseline's, with its interval."""

    estimate: float | None  # percent; None when the baseline got nothing right
    interval: tuple[float, float] | None
    base_accuracy: float | None
    cand_accuracy: float | None
    n: int
    clusters: int
    level: float
    method: str
    undefined_share: float = 0.0  # resamples whose baseline had no correct answer (left out)


def _cluster_totals(base: list[bool], cand: list[bool], clusters: list[str]) -> tuple[np.ndarray, np.ndarray]:
    index: dict[str, int] = {}
    for c in clusters:
        index.setdefault(str(c), len(index))
    b, c_ = np.zeros(len(index)), np.zeros(len(index))
    for x, y, k in zip(base, cand, clusters, strict=True):
        b[index[str(k)]] += bool(x)
        c_[index[str(k)]] += bool(y)
    return b, c_


def recovery(base: list[bool], cand: list[bool], clusters: list[str] | None = None, level: float = 0.95,
             seed: int = 0, n_resamples: int = 2000) -> Recovery:
    """Recovery % of paired per-item results (same items, same order) with a BCa paired cluster
    bootstrap interval. ``clusters``: each item's cluster (None: every item its own)."""
    if len(base) != len(cand):
        raise ValueError(f"paired results: {len(base)} baseline and {len(cand)} candidate items")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    clusters = [str(i) for i in range(len(base))] if clusters is None else clusters
    n = len(base)
    b, c = _cluster_totals(base, cand, clusters)
    k = len(b)
    base_acc = float(b.sum()) / n if n else None
    cand_acc = float(c.sum()) / n if n else None
    if not n or b.sum() == 0:
        return Recovery(None, None, base_acc, cand_acc, n, k, level, "undefined: the baseline answered none correctly")
    est = 100.0 * float(c.sum() / b.sum())
    if k < 2:
        return Recovery(est, None, base_acc, cand_acc, n, k, level, "no interval: fewer than 2 clusters")
    if (right := int((b > 0).sum())) < MIN_RIGHT_CLUSTERS:  # a resampled ratio of one or two successes: no spread
        return Recovery(est, None, base_acc, cand_acc, n, k, level, f"no interval: the baseline got items right in "
                        f"{right} cluster(s); an interval needs {MIN_RIGHT_CLUSTERS}")
    rng = np.random.default_rng(seed)
    w = rng.multinomial(k, np.full(k, 1.0 / k), size=n_resamples).astype(float)
    wb, wc = w @ b, w @ c
    ok = wb > 0
    boot = 100.0 * wc[ok] / wb[ok]
    undefined = 1.0 - float(ok.mean())
    if boot.size < n_resamples / 2:
        return Recovery(est, None, base_acc, cand_acc, n, k, level, "no interval: most resamples had no correct "
                        "baseline answer", undefined)
    alpha = (1.0 - level) / 2
    jack_b, jack_c = b.sum() - b, c.sum() - c
    if np.any(jack_b == 0):
        lo, hi = np.quantile(boot, [alpha, 1 - alpha])
        return Recovery(est, (float(lo), float(hi)), base_acc, cand_acc, n, k, level,
                        "percentile cluster bootstrap (a jackknife ratio was undefined)", undefined)
    prop = (np.sum(boot < est) + 0.5 * np.sum(boot == est)) / boot.size
    prop = min(max(prop, 1.0 / boot.size), 1.0 - 1.0 / boot.size)
    z0 = _N.inv_cdf(prop)
    jack = 100.0 * jack_c / jack_b
    d = jack.mean() - jack
    denom = 6.0 * float(np.sum(d * d)) ** 1.5
    accel = float(np.sum(d ** 3)) / denom if denom > 0 else 0.0
    z_hi = math.sqrt(k / (k - 1)) * t_quantile(1 - alpha, k - 1)  # expanded for few clusters
    qs = [_N.cdf(z0 + (z0 + z) / (1 - accel * (z0 + z))) for z in (-z_hi, z_hi)]
    lo, hi = np.quantile(boot, qs)
    return Recovery(est, (float(lo), float(hi)), base_acc, cand_acc, n, k, level, "BCa paired cluster bootstrap",
                    undefined)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion around the normal one (Abramowitz &
    Stegun 26.7.5): within 0.005 of the exact value from 3 degrees of freedom on for 0.9 <= p <= 0.975
    (0.05 at p = 0.995 and 3 degrees of freedom)."""
    z = _N.inv_cdf(p)
    v = float(max(df, 1))
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * v ** 4))


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (binomial, p = 1/2)."""
    if lost < 0 or gained < 0:
        raise ValueError("discordant counts cannot be negative")
    n, k = lost + gained, min(lost, gained)
    if n == 0:
        return 1.0
    if n <= EXACT_UP_TO:
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    else:
        logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(k + 1)]
        top = max(logs)
        tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, 2.0 * tail)


def _connor_n(delta: float, psi: float, za: float, zb: float) -> float:
    return (za * math.sqrt(psi) + zb * math.sqrt(max(psi - delta * delta, 0.0))) ** 2 / (delta * delta)


def min_detectable_difference(n_items: int, base_acc: float, discordance: float, alpha: float = 0.05,
                              power: float = 0.8) -> float | None:
    """The smallest accuracy drop (percentage points) that `n_items` paired items detect with
    McNemar's test at two-sided level ``alpha`` and ``power``, when the two variants disagree on a
    share ``discordance`` of items (Connor 1987). None when no drop possible at that discordance
    and baseline accuracy is detectable (it would need more losses than the baseline has right
    answers, or more than the discordance allows)."""
    if n_items < 1:
        raise ValueError(f"n_items must be at least 1, got {n_items}")
    if not 0 < base_acc <= 1 or not 0 < discordance <= 1:
        raise ValueError("base_acc and discordance must be in (0, 1]")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must be in (0, 1)")
    za, zb = _N.inv_cdf(1 - alpha / 2), _N.inv_cdf(power)
    psi = discordance
    if _connor_n(psi, psi, za, zb) > n_items:  # even every disagreement a loss is too few items
        return None
    lo, hi = 1e-9, psi
    for _ in range(100):
        mid = (lo + hi) / 2
        if _connor_n(mid, psi, za, zb) > n_items:
            lo = mid
        else:
            hi = mid
    delta = hi
    if (psi + delta) / 2 > base_acc:  # losses beyond the baseline's correct answers
        return None
    return 100.0 * delta
