"""A grader's grades of a slice's rows as read-only views onto the grade columns a `rows.Table`
holds (`GradeRow`, `GradeViews`): what each grader's `summarise` and `margin_values` are handed
for rows read from the ledger, four bytes a grade until one is read, not a dict a grade."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .rows import FixedKeys, Row, Table, row_index, table_of


class GradeRow(FixedKeys):
    """One grade of a report row, with its case: what `Ledger.latest_grades` gives plus ``case_id``,
    as a read-only mapping onto the grader's columns (a slice of a million rows hands its
    grader a million of these, not a million dicts). It holds the row's index (the `Row`'s own
    int, shared) and finds the grade, id and case when asked: no new number a grade."""

    __slots__ = ("_c", "_i", "_case")
    KEYS = ("request_id", "grader", "grader_version", "value", "passed", "explanation", "detail", "case_id")

    def __init__(self, ctx: _GradeContext, i: int, case_id: str | None = None) -> None:
        self._c, self._i, self._case = ctx, i, case_id

    def __getitem__(self, key: str) -> Any:
        c = self._c
        if key == "case_id":
            return c.case_of(self._i) if self._case is None else self._case
        if key == "request_id":
            return c.id_of(self._i)
        return c.fields[key](c.at[self._i])

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.KEYS else default

    def __contains__(self, key: object) -> bool:
        return key in self.KEYS


class _GradeContext:
    """What a grader's `GradeRow`s share: its columns' getters, each row's place in them, the
    row's id and case."""

    __slots__ = ("fields", "at", "id_of", "case_of")

    def __init__(self, fields: dict[str, Any], at: Any, id_of: Any, case_of: Any) -> None:
        self.fields, self.at, self.id_of, self.case_of = fields, at, id_of, case_of


def grades_by_grader(rows: list[Any]) -> dict[str, list[Mapping[str, Any]]] | None:
    """Each grader's grades of the rows with their case (`GradeRow`s), in row order, when the
    rows are views of one table; None otherwise."""
    t = table_of(rows)
    if t is None:
        return None
    out = {name: grade_views(rows, name) for name in t.graded}
    return {k: v for k, v in out.items() if v}


def grade_views(rows: list[Any], grader: str, case: Any = None) -> Sequence[Mapping[str, Any]] | None:
    """One grader's grades of the rows that have one, in row order, each with ``case_id`` (the
    row's case, or ``case(row)``), as `GradeViews` (a `GradeRow` made as each is read); None when
    the rows are not views of one table."""
    t = table_of(rows)
    if t is None:
        return None
    g = t.graded.get(grader)
    if g is None:
        return []
    version, value, passed, explanation = (c.getter() for c in g.cols)
    fields = {"grader": lambda k: grader, "grader_version": version, "value": value, "passed": passed,
              "explanation": explanation, "detail": g.detail.__getitem__}
    ctx = _GradeContext(fields, g.at, t.get["id"], t.get["case_id"])
    idx = row_index(rows)[1].astype(np.int32)  # type: ignore[index]
    idx = idx[np.frombuffer(g.at, dtype=np.int32)[idx] >= 0]
    return GradeViews(ctx, idx, t, case)


class GradeViews(Sequence[Mapping[str, Any]]):
    """A grader's grades of some rows, in row order: a sequence of `GradeRow`s held as the rows'
    indices (4 bytes a grade), each view made as it is read. A slice of a million rows hands each
    grader this, not a list of a million objects; read it as a list (len, iterate, index, slice)."""

    __slots__ = ("_ctx", "_idx", "_t", "_case")

    def __init__(self, ctx: _GradeContext, idx: np.ndarray, t: Table, case: Any = None) -> None:
        self._ctx, self._idx, self._t, self._case = ctx, idx, t, case

    def _view(self, i: int) -> GradeRow:
        return GradeRow(self._ctx, i, None if self._case is None else self._case(Row(self._t, i)))

    def __len__(self) -> int:
        return int(self._idx.size)

    def __iter__(self) -> Iterator[GradeRow]:
        for i in self._idx.tolist():
            yield self._view(i)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return GradeViews(self._ctx, self._idx[k], self._t, self._case)
        return self._view(int(self._idx[k]))

    def __add__(self, other: Any) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Any) -> list[Any]:
        return [*other, *self]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))
