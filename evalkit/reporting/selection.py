"""Like with like: which rows a comparison uses. A sweep's levels are not one population (pooled,
the higher levels' queueing would read as a variant's latency), so every table, verdict, gate and
recommendation compares each variant at its first load level, or level by level when asked. The
report, `check`, `recommend`, the findings, the HTML report and the dataset card all call these."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .rows import Rows


def level_of(r: dict[str, Any]) -> int:
    return r.get("concurrency") or 1


def _memo(rows: list[dict[str, Any]], key: str, compute: Any) -> Any:
    """Computed once per `Rows` (the report, the findings and the HTML report all ask the same
    question of the same million rows); a plain list computes each time."""
    memo = getattr(rows, "memo", None)
    if memo is None:
        return compute(rows)
    if (hit := memo.get(key)) is None or hit[0] != len(rows):
        got = compute(rows)
        # the rows themselves are kept as a mark, not a reference: a cycle would hold a slice of a
        # million rows until the cyclic collector ran, long after the report let it go
        hit = memo[key] = (len(rows), _SELF if got is rows else got)
    return rows if hit[1] is _SELF else hit[1]


_SELF = object()


def _sweep_levels(rows: list[dict[str, Any]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        out[r["variant"]].add(level_of(r))
    return dict(out)


def sweep_levels(rows: list[dict[str, Any]]) -> dict[str, set[int]]:
    """The concurrency levels each variant's rows were sent at."""
    return _memo(rows, "sweep_levels", _sweep_levels)


def _by_variant(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    if isinstance(rows, Rows) and rows.parts is not None:  # each variant's part as views, not a view a row
        return rows.groups("variant")  # type: ignore[return-value]
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["variant"]].append(r)
    return dict(out)


def by_variant(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each variant's rows, in order: one pass, not one per variant."""
    return _memo(rows, "by_variant", _by_variant)


def _first_level(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    levels = sweep_levels(rows)
    if all(len(ls) == 1 for ls in levels.values()):  # one level per variant: every row is at its first
        return rows
    low = {v: min(ls) for v, ls in levels.items()}
    return Rows(r for r in rows if level_of(r) == low[r["variant"]])


def first_level(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each variant's rows at its lowest concurrency (a sweep's first level; the one level otherwise)."""
    return _memo(rows, "first_level", _first_level)


def by_level(rows: list[dict[str, Any]], baseline: str | None) -> list[tuple[int, list[dict[str, Any]]]]:
    """(level, rows) for every level the baseline and at least one other variant both reached:
    what a comparison level by level uses."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[level_of(r)].append(r)
    out = []
    for level, rs in sorted(groups.items()):
        names = {r["variant"] for r in rs}
        if baseline is None or (baseline in names and len(names) > 1):
            out.append((level, rs))
    return out


def is_swept(rows: list[dict[str, Any]]) -> bool:
    return any(len(v) > 1 for v in sweep_levels(rows).values())


def level_note(levels: dict[str, set[int]]) -> str:
    first = sorted({min(ls) for ls in levels.values()})
    n = max(len(ls) for ls in levels.values())
    return (f"tables, verdicts and findings compare each variant at its first load level (concurrency "
            f"{', '.join(map(str, first))}); the run swept {n} levels, and the load-levels table shows each of them")
