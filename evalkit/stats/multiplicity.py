"""Holm's step-down, and the one level at which every hypothesis of a family can be shown as an
interval that agrees with its decision."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (step-down; monotone): rejecting where the adjusted p is
    at or below alpha keeps the chance of any false rejection in the family at or below alpha."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[index]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        adj = min(1.0, (m - rank) * pvalues[i])  # type: ignore[operator]
        running = max(running, adj)
        out[i] = running
    return out


def holm_level(pvalues: list[float | None], alpha: float) -> tuple[list[bool], float]:
    """Holm's decisions (reject where p <= the step's level, stopping at the first that is not)
    and the level of the step where it stopped: alpha / (m - j + 1), j the first hypothesis kept
    (alpha itself when every one was rejected). At that level a two-sided interval excludes the
    tested value of every rejected hypothesis and includes that of every kept one, so an interval
    printed at it never disagrees with a decision (the rejected ones had p at or below a smaller
    step's level; the kept ones have p above this one)."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[index]
    m = len(idx)
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(idx):
        level = alpha / (m - rank)
        if pvalues[i] > level:  # type: ignore[operator]
            return rejected, level
        rejected[i] = True
    return rejected, alpha


def pairs_for_a_verdict(n_hypotheses: int, alpha: float = 0.05, margins: tuple[tuple[str, float], ...] = (),
                        min_pairs: int = 0) -> int:
    """The fewest pairs with which every margin can reach a verdict: the smallest n at which a
    candidate with no difference at all could be shown non-inferior at Holm's first step (p at or
    below alpha / m, m hypotheses), whatever the other margins do. Fewer pairs cannot decide,
    whatever the data; this is a floor, not a power calculation (`evalkit plan --detect` sizes for
    power).

    - Any margin: an exact sign-flip test on n pairs cannot give a two-sided p below 2 x 2^-n
      (8 pairs and 8 hypotheses: 0.0078 > 0.00625, so no verdict whatever the data).
    - A pass-rate margin (``("pp", δ)``, δ < 0): the exact score test with no case changed must
      reach alpha / m at δ (−10 pp over 8 hypotheses: 70 pairs; 2 × 0.9ⁿ alone would say 55).
    - A flip-rate margin (``("flips", δ)``): no flip in n cases must show the rate below δ
      (5 pp, one hypothesis: 72 cases).
    - ``min_pairs``: a margin's own floor (the KL margins': their per-case shape).

    Cached: a simulation asks the same question thousands of times."""
    return _pairs_for_a_verdict(max(1, n_hypotheses), alpha, tuple(sorted(set(margins))), min_pairs)


@lru_cache(maxsize=256)
def _pairs_for_a_verdict(m: int, alpha: float, margins: tuple[tuple[str, float], ...], min_pairs: int) -> int:
    from .binomial import FlipRate
    from .proportions import PairedProportions

    level = alpha / m
    need = max(min_pairs, math.ceil(1 + math.log2(m / alpha)))
    for kind, delta in margins:
        if kind == "pp" and delta < 0:
            def p(n: int, delta: float = delta) -> float:
                return PairedProportions(gains=0, losses=0, n=n).p(delta)
        elif kind == "flips" and delta > 0:
            def p(n: int, delta: float = delta) -> float:
                return FlipRate(0, n).p(delta)
        else:  # a margin an unchanged candidate cannot meet (it asks a gain): the sign-flip floor
            continue
        need = max(need, _first_n(p, level))
    return need


def _first_n(p: Callable[[int], float], level: float, cap: int = 100_000) -> int:
    """The smallest n with p(n) <= level, p falling with n: doubling, then bisection."""
    hi = 2
    while p(hi) > level:
        if hi >= cap:
            return cap
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if p(mid) <= level else (mid, hi)
    return hi
