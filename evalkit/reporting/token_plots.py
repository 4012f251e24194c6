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
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        d = ((r.get("grades") or {}).get("divergence") or {}).get("detail") or {}
        if d.get("status") != "ok" or not d.get("kl_tokens"):
            continue
        name = f"{r['variant']} (floor)" if d.get("kind") == "floor" else r["variant"]
        for i, x in enumerate(d["kl_tokens"]):
            acc[name][i].append(x)
    return {name: [(float(i), sum(v) / len(v)) for i, v in sorted(pos.items()) if len(v) >= MIN_CASES]
            for name, pos in acc.items()}


def log10(x: float) -> float:
    """A damaged model's KL is hundreds of times a good one's: one log axis shows both."""
    return math.log10(max(x, FLOOR))


def divergence_plots(rows: list[dict[str, Any]], variants: list[str], cols: dict[str, str]) -> list[tuple[str, str]]:
    series = {k: [(x, log10(y)) for x, y in v] for k, v in kl_along(rows).items() if v}
    if not series:
        return []
    colors = {**cols, **{k: "#888" for k in series if k.endswith("(floor)")}}
    title = "Teacher-forced KL along the answer (mean over cases; grey: the baseline's batching floor)"
    return [(title, svgplot.lines(title, "answer token", f"log10 KL (nats/token; {FLOOR:g} for 0)", series,
                                  colors=colors))]
