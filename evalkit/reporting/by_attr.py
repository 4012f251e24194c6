"""`report --by ATTR`: quality per attribute value, beside the latency slices. Per variant and
value: the requests counted (the baseline's noise-floor passes are drift's, not cases, so they are
not counted), every grader's own summary columns (pass rates, means: each grader's `Aggregate`,
against the baseline's same slice), and per pass/fail grader the flips against the baseline on the
slice's cases. The same blocks in the terminal, Markdown and HTML report."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from ..catalogue import Metric, fmt
from ..grading.registry import summary_columns
from ..ledger.analysis import REQUEST_KEYS
from .report import quality


def measured(rows: list[dict[str, Any]], baseline: str | None, repeats: int) -> list[dict[str, Any]]:
    """The rows that are cases: without the baseline's noise-floor passes (repeats past the run's)."""
    return [r for r in rows if r["variant"] != baseline or r["repeat"] < repeats]




def slice_value(r: dict[str, Any], key: str) -> Any:
    """A row's value of a slicing key: a request field, else one of its case's attributes (a dict or
    a list as sorted JSON text, as `Ledger.distributions` gives it)."""
    if key in REQUEST_KEYS:  # else one of the case's attributes
        return r.get(key)
    v = r["attributes"].get(key)
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v


def by_quality(rows: list[dict[str, Any]], baseline: str | None, by: list[str], flip_table: list[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    """Per variant x value(s) of ``by``: n, errors, each grader's columns, each pass/fail grader's
    flips against the baseline (cases, flipped, %). ``rows``: the measured rows (`measured`);
    ``flip_table``: `flips.flips` of the same rows by ``by``."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(slice_value(r, b) for b in by)].append(r)
    out = []
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        rs = groups[key]
        base_ok = [r for r in rs if r["variant"] == baseline and r["error_class"] is None]
        flip = {(e["variant"], e["grader"]): e for e in flip_table if e["group"] == key and e["rule"] is None}
        for v in sorted({r["variant"] for r in rs}):
            mine = [r for r in rs if r["variant"] == v]
            ok = [r for r in mine if r["error_class"] is None]
            entry: dict[str, Any] = {"variant": v, **dict(zip(by, key, strict=True)), "n": len(mine),
                                     "errors": len(mine) - len(ok), "cases": len({r["case_id"] for r in mine}),
                                     **quality(ok, None if v == baseline else base_ok)}
            entry["flips"] = {g: {"cases": e["cases"], "flipped": e["gains"] + e["losses"], "pct": e["flip_pct"]}
                              for (fv, g), e in flip.items() if fv == v}
            out.append(entry)
    return out


def _columns(entries: list[dict[str, Any]]) -> list[Metric]:
    """The graders' columns that have a value in some slice."""
    return [m for m in summary_columns() if any(e.get(m.key) is not None for e in entries)]


def _flip_graders(entries: list[dict[str, Any]]) -> list[str]:
    return sorted({g for e in entries for g in e.get("flips", {})})


def _cells(e: dict[str, Any], by: list[str], cols: list[Metric], fl: list[str]) -> list[str]:
    flips_ = e.get("flips", {})
    return [e["variant"], *(str(e.get(b)) for b in by), str(e["n"]), str(e["errors"]),
            *(fmt(m, e.get(m.key)) for m in cols),
            *(f"{flips_[g]['flipped']}/{flips_[g]['cases']}" if g in flips_ else "-" for g in fl)]


def header(by: list[str], cols: list[Metric], fl: list[str]) -> list[str]:
    return ["variant", *by, "n", "err", *(m.label for m in cols), *(f"{g} flips" for g in fl)]


TITLE = ("quality by {by} (n: requests, the baseline's noise-floor pass not counted; flips: cases whose pass/fail "
         "changed vs the baseline, of the cases in the slice)")


def by_table(f: dict[str, Any], by: list[str]) -> tuple[str, list[str], list[list[str]], int] | None:
    """The terminal / Markdown table as (title, header, rows, key columns): `document.findings_blocks`
    shows it after the latency slices."""
    entries = f.get("by_quality") or []
    cols, fl = _columns(entries), _flip_graders(entries)
    if not entries or not (cols or fl):
        return None
    return TITLE.format(by=", ".join(by)), header(by, cols, fl), [_cells(e, by, cols, fl) for e in entries], 1 + len(by)
