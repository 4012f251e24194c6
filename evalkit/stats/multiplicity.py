"""Holm's step-down, and the one level at which every hypothesis of a family can be shown as an
interval that agrees with its decision."""

from __future__ import annotations

import math


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


def pairs_for_a_verdict(n_hypotheses: int, alpha: float = 0.05) -> int:
    """The fewest pairs with which any verdict is possible: an exact sign-flip test on n pairs
    cannot give a two-sided p below 2 x 2^-n, and Holm over m hypotheses asks the smallest p to be
    at or below alpha / m. (8 pairs and 8 hypotheses: 0.0078 > 0.00625, so no verdict whatever
    the data.)"""
    return math.ceil(1 + math.log2(max(1, n_hypotheses) / alpha))
