"""Agreement between two raters of the same items (a grader and a person): Cohen's kappa with a
percentile bootstrap interval over items (seeded, so reproducible) and the confusion matrix.

kappa = (p_o − p_e) / (1 − p_e): the observed agreement beyond what the two raters' own label
frequencies give by chance. It is undefined when chance agreement is already 1 (both raters
used one and the same label throughout); then it is None and the confusion matrix says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

N_RESAMPLES = 2000
SEED = 0


def _kappa(codes_a: np.ndarray, codes_b: np.ndarray, k: int) -> float | None:
    n = codes_a.size
    if n == 0:
        return None
    po = float(np.mean(codes_a == codes_b))
    pe = float(np.dot(np.bincount(codes_a, minlength=k), np.bincount(codes_b, minlength=k))) / (n * n)
    return None if pe >= 1.0 - 1e-12 else (po - pe) / (1.0 - pe)


def cohen_kappa(a: Sequence[Any], b: Sequence[Any], categories: Sequence[Any] | None = None,
                alpha: float = 0.05) -> dict[str, Any]:
    """Kappa of two equally long label sequences (item i rated a[i] and b[i]), its (1 − alpha)
    bootstrap interval, observed and chance agreement, and the confusion matrix
    (``confusion[x][y]``: items the first rater called x and the second y)."""
    if len(a) != len(b):
        raise ValueError("both raters must rate the same items")
    cats = list(categories) if categories is not None else sorted({*a, *b}, key=str)
    index = {c: i for i, c in enumerate(cats)}
    ca = np.array([index[x] for x in a], dtype=np.int64)
    cb = np.array([index[x] for x in b], dtype=np.int64)
    n, k = ca.size, len(cats)
    kappa = _kappa(ca, cb, k)
    ci = None
    if n >= 2 and kappa is not None:
        rng = np.random.default_rng(SEED)
        draws = [v for _ in range(N_RESAMPLES)
                 if (v := _kappa(ca[(s := rng.integers(0, n, n))], cb[s], k)) is not None]
        if len(draws) >= N_RESAMPLES // 2:  # most resamples defined: the interval means something
            ci = [float(np.quantile(draws, alpha / 2)), float(np.quantile(draws, 1 - alpha / 2))]
    pairs = Counter(zip(a, b, strict=True))
    po = float(np.mean(ca == cb)) if n else None
    pe = float(np.dot(np.bincount(ca, minlength=k), np.bincount(cb, minlength=k))) / (n * n) if n else None
    return {"n": n, "kappa": kappa, "ci95": ci, "observed": po, "expected": pe, "categories": cats,
            "confusion": {str(x): {str(y): pairs.get((x, y), 0) for y in cats} for x in cats}}


def strength(kappa: float | None) -> str:
    """Landis & Koch's words for a kappa (a convention, not a test)."""
    if kappa is None:
        return "undefined"
    for limit, word in ((0.0, "poor"), (0.2, "slight"), (0.4, "fair"), (0.6, "moderate"), (0.8, "substantial")):
        if kappa <= limit:
            return word
    return "almost perfect"


def confusion_lines(r: dict[str, Any], rows_are: str, cols_are: str) -> list[str]:
    """The confusion matrix as aligned text lines (rows: the first rater)."""
    cats = [str(c) for c in r["categories"]]
    w = max(len(c) for c in [*cats, rows_are]) + 2
    out = [f"rows: {rows_are}; columns: {cols_are}", " " * w + "".join(f"{c:>{w}}" for c in cats)]
    out += [f"{x:<{w}}" + "".join(f"{r['confusion'][x][y]:>{w}}" for y in cats) for x in cats]
    return out
