"""Quality under load, per variant: the highest load level against concurrency 1, case by case
(same variant, same case and repeat): how many answers stayed byte-identical and how far the
others drifted (the `load_drift` grader), and what that did to every grader that offers a margin
(schema, persona, formality, plugins): the paired difference with a 95 % interval."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..execution.patterns import REFERENCE
from ..grading.base import declared_case_values, paired_differences
from ..grading.registry import available
from ..ledger import Ledger
from ..stats import bootstrap_ci


def quality_under_load(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """Per variant with a level above 1 and requests sent one at a time (`ledger.case_reads`): the
    load_drift grades of its highest level, and per margin the paired difference of that level
    against concurrency 1 with a 95 % bootstrap interval. A grader's declared margins
    (`CaseValue`) are paired in the ledger; one that declares none is handed each side's grades."""
    declared, read = [], []
    for name, cls in available().items():
        if not cls.aggregate.margins:
            continue
        mine, theirs = declared_case_values(cls, False), declared_case_values(cls, True)
        if mine is None or theirs is None:
            read.append((name, cls))
        else:
            declared += [(name, m, v, theirs[m]) for m, v in mine.items() if m in theirs]
    entries, pairs = ledger.load_quality(run_id, REFERENCE, declared)
    if not entries:
        return []
    by_grader = {m: name for name, m, _, _ in declared}
    # variant -> grader -> margin -> the differences (distinct values, how often each came)
    diffs: dict[str, dict[str, dict[str, tuple[list[float], list[int]]]]] = {v: {} for v in entries}
    for v, margins in pairs.items():
        for m, d in margins:
            diffs[v].setdefault(by_grader.get(m.partition(":")[0], ""), {})[m] = d
    for name, cls in read:
        sides: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        for v, loaded, grades in ledger.load_side_grades(run_id, REFERENCE, name):
            sides[(v, loaded)] = grades
        for v in entries:
            got = paired_differences(cls, sides.get((v, True), []), sides.get((v, False), []))
            diffs[v][name] = {m: counted(d) for m, d in got.items() if d}
    order = list(ledger.slice_levels(run_id))  # variants in the order the rows first show them
    return [_entry(v, entries[v], diffs[v], [n for n, c in available().items() if c.aggregate.margins])
            for v in sorted(entries, key=order.index)]


def counted(values: list[float]) -> tuple[list[float], list[int]]:
    """``values`` as (distinct values ascending, how often each came), as the ledger gives them."""
    got = Counter(values)
    return sorted(got), [got[x] for x in sorted(got)]


def _entry(v: str, outline: dict[str, Any], diffs: dict[str, dict[str, tuple[list[float], list[int]]]],
           graders: list[str]) -> dict[str, Any]:
    n, drift_n = outline["n"], outline["drift_n"]
    entry: dict[str, Any] = {"variant": v, "level": outline["top"], "pairs": n,  # the deltas' own count when more
                             "identical_pct": 100.0 * outline["same"] / n if n else None,
                             "drift_mean": outline["drift_sum"] / drift_n if drift_n else None, "deltas": {}}
    for name in graders:
        for m, (values, counts) in diffs.get(name, {}).items():
            ci = bootstrap_ci(values, counts=counts)  # type: ignore[arg-type]
            pairs = sum(counts)
            entry["deltas"][m] = {"delta": math.fsum(x * c for x, c in zip(values, counts, strict=True)) / pairs,
                                  "ci95": list(ci) if ci else None, "pairs": pairs}
    entry["pairs"] = max([entry["pairs"], *(x["pairs"] for x in entry["deltas"].values())])
    return entry


def lines(entries: list[dict[str, Any]]) -> list[str]:
    """One line per variant; no interval, and no difference, from zero pairs: "no pairs" instead."""
    out = []
    for e in entries:
        d = "; ".join(_delta_text(m, x, e["pairs"]) for m, x in e["deltas"].items())
        ident = "-" if e["identical_pct"] is None else f"{e['identical_pct']:.0f} %"
        drift = "-" if e["drift_mean"] is None else round(e["drift_mean"], 3)
        head = f"{ident} byte-identical, drift {drift}" if e["pairs"] else "no pairs"
        out.append(f"quality under load {e['variant']}: concurrency {e['level']} vs 1 over {e['pairs']} pairs: {head}"
                   + (f"; {d}" if d else ""))
    return out


def _delta_text(m: str, x: dict[str, Any], pairs: int) -> str:
    """`schema_pass +0 [+0, +0]`, with its own pairs when they are not the line's; never an interval from none."""
    n = x.get("pairs", pairs)
    if not n:
        return f"{m} no pairs"
    ci = f" [{x['ci95'][0]:+.3g}, {x['ci95'][1]:+.3g}]" if x["ci95"] else ""
    return f"{m} {x['delta']:+.3g}{ci}" + (f" over {n} pairs" if n != pairs else "")
