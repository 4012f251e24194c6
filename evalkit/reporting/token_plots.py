"""The HTML report's chart of token-level divergence: KL along the answer (answer token index on x,
log10 of the KL on y), averaged over the cases that reach that token, one line per candidate and one
for the baseline's batching floor. Reads the divergence grader's grades (their `kl_tokens`); nothing
is recomputed; the means per token are the ledger's (`Ledger.chart_series`)."""

from __future__ import annotations

import math

from . import svgplot

MIN_CASES = 3  # a position is drawn where at least this many cases reach it (the tail is a few answers)
FLOOR = 1e-5  # KL below this is drawn at it (the log axis has no 0)


def log10(x: float) -> float:
    """A damaged model's KL is hundreds of times a good one's: one log axis shows both."""
    return math.log10(max(x, FLOOR))


def divergence_plots(along: dict[str, list[tuple[float, float]]], variants: list[str],
                     cols: dict[str, str]) -> list[tuple[str, str]]:
    """``along``: series name -> (token index, mean KL over the answers reaching it), as
    `Ledger.chart_series` gives it (positions reached by MIN_CASES answers at least)."""
    series = {k: [(x, log10(y)) for x, y in v] for k, v in along.items() if v}
    if not series:
        return []
    colors = {**cols, **{k: "#888" for k in series if k.endswith("(floor)")}}
    title = "Teacher-forced KL along the answer (mean over cases; grey: the baseline's batching floor)"
    return [(title, svgplot.lines(title, "answer token", f"log10 KL (nats/token; {FLOOR:g} for 0)", series,
                                  colors=colors))]
