"""Report metrics computed from their declarations (`evalkit.catalogue`): the rows of a run are
turned into columns once (numpy arrays, NaN for missing), and every declared `source` + `agg`
is a vectorised aggregate over a slice's index. One pass per column, whatever the run's size."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

import numpy as np

from .. import catalogue
from ..catalogue import Metric

_P = re.compile(r"^p(\d+(?:\.\d+)?)$")


class Columns:
    """Numeric request columns of a list of rows, plus which rows succeeded."""

    def __init__(self, rows: list[dict[str, Any]], names: Iterable[str]) -> None:
        self.n = len(rows)
        names = list(dict.fromkeys(names))
        # one pass over the rows for every column (a million dicts: each pass is memory-bound)
        try:
            get = itemgetter("error_class", *names)
            table = [get(r) for r in rows] if names else [(get(r),) for r in rows]  # one key: no tuple
        except KeyError:  # rows made by hand (tests, importers) may lack a column: missing is None
            table = [(r["error_class"], *(r.get(n) for n in names)) for r in rows]
        self.ok = np.fromiter((t[0] is None for t in table), dtype=bool, count=self.n)
        values = np.array([t[1:] for t in table], dtype=float).reshape(self.n, len(names))  # None -> NaN
        self.cols: dict[str, np.ndarray] = {name: np.ascontiguousarray(values[:, i]) for i, name in enumerate(names)}

    def values(self, name: str, idx: np.ndarray, ok_only: bool) -> np.ndarray:
        sel = idx[self.ok[idx]] if ok_only else idx
        v = self.cols[name][sel]
        return v[~np.isnan(v)]


def aggregate(m: Metric, cols: Columns, idx: np.ndarray) -> float | int | None:
    """One declared metric over the rows at ``idx`` (percentiles: linear interpolation, type 7)."""
    if m.agg == "count":
        return int(idx.size)
    if m.agg == "errors":
        return int((~cols.ok[idx]).sum())
    v = cols.values(m.source or m.key, idx, m.ok_only)
    if v.size == 0:
        return None
    if m.agg == "mean":
        return float(v.mean())
    if m.agg == "max":
        return float(v.max())
    if m.agg == "max_pct":
        return 100.0 * float(v.max())
    if m.agg == "positive":
        return int((v > 0).sum())
    if (p := _P.match(m.agg or "")) is not None:
        return float(np.percentile(v, float(p.group(1))))
    raise ValueError(f"metric {m.key}: unknown aggregate {m.agg!r}")


def declared() -> list[Metric]:
    """The report metrics computed from a source column (the rest are computed by name)."""
    return [m for m in catalogue.REPORT if m.agg is not None]


def slices_metrics(cols_of: Callable[[list[str]], Columns], idxs: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Every declared metric (source + agg) of several slices of the same rows, read a source column at a time
    (``cols_of(names)``: those columns of the rows), so one column's values are held, not all."""
    ms = declared()
    by_source: dict[str | None, list[Metric]] = {}
    for m in ms:
        by_source.setdefault(None if m.agg in ("count", "errors") else m.source or m.key, []).append(m)
    got: dict[str, dict[str, Any]] = {s: {} for s in idxs}
    for source, group in by_source.items():
        cols = cols_of([] if source is None else [source])
        for s, idx in idxs.items():
            got[s].update((m.key, aggregate(m, cols, idx)) for m in group)
        del cols
    return {s: {m.key: got[s][m.key] for m in ms} for s in idxs}
