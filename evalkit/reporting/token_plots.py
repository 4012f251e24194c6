"""The HTML report's chart of token-level divergence: KL along the answer (answer token index on x,
log10 of the KL on y), averaged over the cases that reach that token, one line per candidate and one
for the baseline's batching floor. Reads the divergence grader's grades (their `kl_tokens`); nothing
is recomputed."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from . import svgplot

MIN_CASES = 3  # a position is drawn where at least this many cases reach it (the tail is a few answers)
FLOOR = 1e-5  # KL below this is drawn at it (the log axis has no 0)


def kl_along(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """series name -> (token index, mean KL over the cases that reach it)."""
    acc: dict[str, dict[int, list[float]]] = {}
    first: dict[str, tuple[Any, ...]] = {}
    for i, r in enumerate(rows):
        kl_add(acc, first, r, (i,))
    return kl_series(acc, first)


def kl_add(acc: dict[str, dict[int, list[float]]], first: dict[str, tuple[Any, ...]], r: dict[str, Any],
           order: tuple[Any, ...] | None = None) -> None:
    """One row's KL along its answer into running [sum, count]s per series and position (a run's
    rows need not be held); ``first``: each series' first row's order (``order``, else its seq, id)."""
    d = ((r.get("grades") or {}).get("divergence") or {}).get("detail") or {}
    if d.get("status") != "ok" or not d.get("kl_tokens"):
        return
    name = f"{r['variant']} (floor)" if d.get("kind") == "floor" else r["variant"]
    if name not in first:
        first[name] = order if order is not None else row_order(r)
    pos = acc.setdefault(name, defaultdict(lambda: [0.0, 0]))
    for i, x in enumerate(d["kl_tokens"]):
        s = pos[i]
        s[0] += x  # summed in the rows' order: the same mean as sum(list) / len(list)
        s[1] += 1


def row_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """Where a row comes in the run's rows (`request_rows` reads them by seq, then id; NULL first)."""
    return (r.get("seq") is not None, r.get("seq") or 0, r["id"])


def kl_series(acc: dict[str, dict[int, list[float]]], first: dict[str, tuple[Any, ...]]
              ) -> dict[str, list[tuple[float, float]]]:
    """The series in their first rows' order, each position reached by at least MIN_CASES cases."""
    return {name: [(float(i), s / n) for i, (s, n) in sorted(acc[name].items()) if n >= MIN_CASES]
            for name in sorted(acc, key=lambda k: first[k])}


def log10(x: float) -> float:
    """A damaged model's KL is hundreds of times a good one's: one log axis shows both."""
    return math.log10(max(x, FLOOR))


def divergence_plots(kl: list[dict[str, Any]] | dict[str, list[tuple[float, float]]], variants: list[str],
                     cols: dict[str, str]) -> list[tuple[str, str]]:
    """``kl``: the rows, or their `kl_along` already taken (`plots.PlotData` takes it a variant at a time)."""
    along = kl if isinstance(kl, dict) else kl_along(kl)
    series = {k: [(x, log10(y)) for x, y in v] for k, v in along.items() if v}
    if not series:
        return []
    colors = {**cols, **{k: "#888" for k in series if k.endswith("(floor)")}}
    title = "Teacher-forced KL along the answer (mean over cases; grey: the baseline's batching floor)"
    return [(title, svgplot.lines(title, "answer token", f"log10 KL (nats/token; {FLOOR:g} for 0)", series,
                                  colors=colors))]
