"""The rows a report reads: each measured request (final attempt, not a warm-up) with its case's
fields, its newest grades and its output rate, without the texts or the columns no report reads.

A million rows as dicts are gigabytes (~2.6 kB a row, twice that with grades), so the rows are read
in chunks into columns (`Table`: doubles, 64-bit integers, codes into each column's distinct
strings) and each row is a `Row`: a read-only mapping onto its place in the columns (~40 bytes).
Every reader indexes a row as it did a dict and gets the same values, of the same types."""

from __future__ import annotations

import ctypes
import gc
import json
import math
from array import array
from collections.abc import Collection, Iterator, Mapping
from functools import cache
from typing import Any

import numpy as np

from ..ledger import Ledger
from ..ledger.store import HEAVY_FIELDS, UNREPORTED
from .rowseq import Row, Rows

_NO_GRADES: dict[str, Any] = {}  # shared by every ungraded row: a large run's are most
_NULL_INT = -(2**63)  # an integer column's NULL (SQLite has no NaN: a double column's NULL is NaN)
_EMPTY: dict[str, Any] = {}
# rows read per fetch: a chunk of tuples costs ~1.5 kB a row while it is turned into columns, so
# a smaller chunk keeps a report's peak lower at no measurable cost in time
CHUNK = 5_000
_DTYPE = {"b": np.int8, "h": np.int16, "i": np.int32, "q": np.int64}
_NARROW = (("b", -(2**7)), ("h", -(2**15)), ("i", -(2**31)))  # narrow integer arrays and their NULL
# the request columns every row's own getters read (case fields, grades, out_tps), whatever else is read
NEEDED = frozenset({"id", "case_id", "completion_tokens", "e2e_ms", "error_class"})


def give_back() -> None:
    """Hand the pages a freed slice leaves in the C heap back to the system (glibc's
    ``malloc_trim``; elsewhere nothing): freed but resident, they would sit under the next
    slice's peak. Called between slices, not per row."""
    if (trim := getattr(_libc(), "malloc_trim", None)) is not None:
        trim(0)


@cache
def _libc() -> Any:
    """The C library's functions (what this process has linked), or None."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


class FixedKeys(Mapping[str, Any]):
    """A read-only mapping whose keys are the class's ``KEYS`` (a view standing in for a dict)."""

    __slots__ = ()
    KEYS: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)

    def __repr__(self) -> str:
        return repr(dict(self))


class RunRows:
    """Every measured row of a run in order, read a stretch at a time each time it is iterated
    (`Ledger.seq_ranges`): what a reader that needs the whole run in order gets, holding one
    stretch. Iterable (again and again) and sized; not indexable."""

    def __init__(self, ledger: Ledger, run_id: str, size: int = 50_000) -> None:
        self.ledger, self.run_id = ledger, run_id
        self.ranges = ledger.seq_ranges(run_id, size)
        self._n: int | None = None

    def __iter__(self) -> Iterator[Row]:
        for seqs in self.ranges:
            yield from request_rows(self.ledger, self.run_id, seqs=seqs)
            give_back()

    def __len__(self) -> int:
        if self._n is None:
            self._n = sum(len(c) for c in self.ledger.measured_columns(self.run_id, ["id"]))
        return self._n


class NotedRows:
    """The measured rows a grader's `notes` can speak of (`Ledger.noted_ids`), in send order, read
    a stretch at a time each time it is iterated: what `RunRows` is for a grader that declares
    `notes_where`. Iterable (again and again) and sized; not indexable."""

    def __init__(self, ledger: Ledger, run_id: str, grader: str, fields: tuple[str, ...], size: int = 50_000) -> None:
        self.ledger, self.run_id, self.size = ledger, run_id, size
        self.ids = ledger.noted_ids(run_id, grader, fields)

    def __iter__(self) -> Iterator[Row]:
        for i in range(0, len(self.ids), self.size):
            yield from request_rows(self.ledger, self.run_id, ids=self.ids[i:i + self.size])
            give_back()

    def __len__(self) -> int:
        return len(self.ids)


class Column:
    """One column, compact: floats as doubles (NaN: NULL), ints as int64 (`_NULL_INT`: NULL),
    strings as codes (-1: NULL) into their distinct values, narrowed once read (`compact`); a
    column whose values mix types keeps Python objects, so every value reads back as it was."""

    __slots__ = ("kind", "data", "values", "codes", "n", "null")

    def __init__(self) -> None:
        self.kind, self.data, self.n, self.null = "null", None, 0, 0
        self.values: list[Any] = []
        self.codes: dict[Any, int] = {}

    def extend(self, vals: list[Any]) -> None:
        types = set(map(type, vals)) - {type(None)}
        if self.kind == "null" and types:
            t = next(iter(types))
            kind = "float" if t is float else "int" if t is int else "str" if t is str else "obj"
            self._start(kind)
        if self.kind == "null":
            self.n += len(vals)
            return
        want = {"float": float, "int": int, "str": str}.get(self.kind)
        if want is None or not types <= {want}:
            self._to_objects()
        if self.kind == "float":
            self.data.extend([math.nan if v is None else v for v in vals])
        elif self.kind == "int":
            self.data.extend([_NULL_INT if v is None else v for v in vals])
        elif self.kind == "str":
            codes = self.codes
            for v in set(vals) - codes.keys() - {None}:
                codes[v] = len(self.values)
                self.values.append(v)
            self.data.extend([-1 if v is None else codes[v] for v in vals])
        else:
            self.data.extend(vals)
        self.n += len(vals)

    def compact(self) -> None:
        """Each column in the narrowest type that holds it once it is read: integers in 8, 16 or
        32 bits when they fit (flags, repeats, levels, counts, ids), a string column's codes in 8
        or 16 when it has few distinct values (a slice's variant, level, finish reason): a slice
        of a million rows is ~45 bytes a row less than in 32 and 64 bits."""
        if self.kind == "int" and self.n:
            a = np.frombuffer(self.data, dtype=np.int64)
            real = a[a != _NULL_INT]
            lo, hi = (int(real.min()), int(real.max())) if real.size else (0, 0)
            for code, null in _NARROW:  # NULL: the type's least value, so every other one fits
                if null < lo and hi < -null:
                    self.kind, self.null = "small", null
                    self.data = array(code, np.where(a == _NULL_INT, null, a).astype(_DTYPE[code]).tobytes())
                    return
        elif self.kind == "str" and len(self.values) < 2**15 and self.data.typecode == "i":
            code = "b" if len(self.values) < 2**7 else "h"
            self.data = array(code, np.frombuffer(self.data, dtype=np.int32).astype(_DTYPE[code]).tobytes())

    def _start(self, kind: str) -> None:
        self.kind = kind
        self.data = {"float": lambda: array("d", [math.nan]) * self.n, "int": lambda: array("q", [_NULL_INT]) * self.n,
                     "str": lambda: array("i", [-1]) * self.n, "obj": lambda: [None] * self.n}[kind]()

    def _to_objects(self) -> None:
        get = self.getter()
        old = [get(i) for i in range(self.n)] if self.kind != "obj" else self.data
        self.kind, self.data, self.values, self.codes = "obj", old, [], {}

    def getter(self) -> Any:
        """The fastest function from a row's index to its value (one per column, bound once)."""
        d, k = self.data, self.kind
        if k == "null":
            return lambda i: None
        if k == "float":
            return lambda i: None if (v := d[i]) != v else v  # NaN is the one value unequal to itself
        if k == "int":
            return lambda i: None if (v := d[i]) == _NULL_INT else v
        if k == "small":
            null = self.null
            return lambda i: None if (v := d[i]) == null else v
        if k == "str":
            vals = self.values
            return lambda i: None if (c := d[i]) < 0 else vals[c]
        return d.__getitem__

    def nulls(self) -> np.ndarray:
        """Which rows are NULL in this column."""
        if self.kind == "null":
            return np.ones(self.n, dtype=bool)
        if self.kind == "str":
            return np.frombuffer(self.data, dtype=_DTYPE[self.data.typecode]) < 0
        get = self.getter()
        return np.fromiter((get(i) is None for i in range(self.n)), dtype=bool, count=self.n)

    def floats(self) -> np.ndarray:
        """The column as doubles, NaN for NULL (numeric columns; for vectorised readers)."""
        if self.kind == "null":
            return np.full(self.n, np.nan)
        if self.kind == "float":
            return np.frombuffer(self.data, dtype=np.float64).copy()
        if self.kind in ("int", "small"):
            a = np.frombuffer(self.data, dtype=_DTYPE[self.data.typecode])
            return np.where(a == (_NULL_INT if self.kind == "int" else self.null), np.nan, a.astype(np.float64))
        get = self.getter()
        return np.array([get(i) for i in range(self.n)], dtype=float)


class Table:
    """A run's report rows as columns, and a `Row` per row."""

    def __init__(self) -> None:
        self.columns: dict[str, Column] = {}
        self.get: dict[str, Any] = {}  # key -> function(row index) -> value
        self.keys: list[str] = []
        self.n = 0
        self.graded: dict[str, _Graded] = {}  # each grader's grades as columns (`grades_by_grader`)

    def finish(self, extra: dict[str, Any]) -> None:
        self.get = {name: c.getter() for name, c in self.columns.items()}
        self.get.update(extra)
        self.keys = list(self.get)


def request_rows(ledger: Ledger, run_id: str, variant: str | None = None, level: int | None = None,
                 seqs: tuple[int, int] | None = None, only: Collection[str] | None = None,
                 graders: Collection[str] | None = None, ids: list[int] | None = None) -> Rows:
    """Measured requests joined with their case and latest grades, lean (see `Ledger.iter_measured`),
    read a chunk at a time into columns. ``variant``, ``level``: one slice's rows only (the same
    rows, values and order as the run's, filtered), so a reader holds one slice, not the run;
    ``seqs``: the rows with first <= seq <= last (`Ledger.seq_ranges`: an ordered pass). ``only``,
    ``graders``: those request columns (with the few the rows' own getters read: `NEEDED`) and
    those graders' grades alone, for a reader that declares what it reads (the charts); ``ids``:
    these requests only (`NotedRows`)."""
    t = Table()
    enabled = gc.isenabled()
    gc.disable()  # chunks of tuples are acyclic: no collection while they come and go
    try:
        for names, chunk in ledger.measured_chunks(run_id, HEAVY_FIELDS | UNREPORTED, size=CHUNK, variant=variant,
                                                   level=level, seqs=seqs, only=None if only is None else {*only, *NEEDED},
                                                   ids=ids):
            if not t.columns:
                t.columns = {name: Column() for name in names}
            for j, c in enumerate(t.columns.values()):
                c.extend([r[j] for r in chunk])
            t.n += len(chunk)
        if not t.columns:
            return Rows()
        for c in t.columns.values():
            c.compact()
        extra = _case_getters(ledger, run_id, t)
        extra["grades"] = _grade_getter(ledger, run_id, t, variant, level, seqs, graders, ids)
        extra["attributes"] = _attributes_getter(t, extra)
        extra["out_tps"] = _out_tps_getter(t)
        t.finish(extra)
        return Rows.of([(t, None)])
    finally:
        if enabled:
            gc.enable()


def _case_getters(ledger: Ledger, run_id: str, t: Table) -> dict[str, Any]:
    """Each case field, through the row's case: a million rows share a few hundred cases."""
    cases = ledger.case_fields(run_id, lean=True)
    col = t.columns["case_id"]
    names = next(iter(cases.values())).keys() if cases else []
    # the case id's code -> its case's fields (case ids are a string column: codes index `values`)
    by_code = [cases.get(cid, _EMPTY) for cid in col.values] if col.kind == "str" else None
    codes = col.data

    def field(k: str) -> Any:
        if by_code is None:
            get = col.getter()
            return lambda i: cases[get(i)][k]
        return lambda i: by_code[codes[i]][k]

    return {k: field(k) for k in names}


def _attributes_getter(t: Table, case_get: dict[str, Any]) -> Any:
    """The case's attributes dict, parsed once per case and shared by its rows."""
    parsed: dict[Any, dict[str, Any]] = {}
    raw_get = case_get.get("attributes_json")
    fields = [(k, case_get[k]) for k in ("task", "persona", "candidate", "formality") if k in case_get]
    case_of = t.columns["case_id"].getter()  # not `t.get`: a getter that held its table would make a cycle

    def attrs(i: int) -> dict[str, Any]:
        raw = raw_get(i) if raw_get else None
        key = raw if raw else ("fields", case_of(i))
        hit = parsed.get(key)
        if hit is None:
            hit = parsed[key] = json.loads(raw) if raw else {k: v for k, f in fields if (v := f(i)) is not None}
        return hit

    return attrs


def _out_tps_getter(t: Table) -> Any:
    tokens, e2e, err = (t.columns[k].getter() for k in ("completion_tokens", "e2e_ms", "error_class"))

    def out_tps(i: int) -> float | None:
        c, e = tokens(i), e2e(i)
        return c / (e / 1000.0) if c and e and err(i) is None else None

    return out_tps


def _grade_getter(ledger: Ledger, run_id: str, t: Table, variant: str | None = None, level: int | None = None,
                  seqs: tuple[int, int] | None = None, which: Collection[str] | None = None,
                  ids: list[int] | None = None) -> Any:
    """Each row's newest grade per grader, as `Ledger.latest_grades` gives them, made when read:
    per grader its columns (version, value, passed, explanation; the detail parsed once per
    distinct text while few are distinct) and each row's place in them."""
    ids = t.columns["id"].floats().astype(np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    graders: dict[str, _Graded] = {}
    details: dict[str | None, Any] = {}
    for chunk in ledger.latest_grade_chunks(run_id, variant=variant, level=level, seqs=seqs, graders=which, ids=ids):
        rid = np.fromiter((g[0] for g in chunk), dtype=np.int64, count=len(chunk))
        pos = np.minimum(np.searchsorted(sorted_ids, rid), len(sorted_ids) - 1)
        found = (sorted_ids[pos] == rid).tolist()
        rows = order[pos].tolist()
        new: dict[str, list[tuple[int, tuple[Any, ...]]]] = {}
        for g, i, ok in zip(chunk, rows, found, strict=True):
            if ok:  # else a warm-up's or an earlier attempt's grade: not a report row
                new.setdefault(g[1], []).append((i, g))
        for name, items in new.items():
            graded = graders.get(name) or graders.setdefault(name, _Graded(t.n))
            graded.add(items, details)
    for g in graders.values():
        for c in g.cols:
            c.compact()
    t.graded = graders
    if not graders:
        return lambda i: _NO_GRADES
    made = [(name, g.at, *(c.getter() for c in g.cols), g.detail) for name, g in graders.items()]
    id_of = t.columns["id"].getter()

    last: list[Any] = [-1, None]  # readers ask a row's grades several times in a row: made once

    def grades(i: int) -> dict[str, dict[str, Any]]:
        if last[0] == i:
            return last[1]  # type: ignore[no-any-return]
        out = {}
        for name, at, version, value, passed, explanation, detail in made:
            k = at[i]
            if k >= 0:
                out[name] = {"request_id": id_of(i), "grader": name, "grader_version": version(k), "value": value(k),
                             "passed": passed(k), "explanation": explanation(k), "detail": detail[k]}
        last[0], last[1] = i, out or _NO_GRADES
        return last[1]  # type: ignore[no-any-return]

    return grades


class _Graded:
    """One grader's grades of the report rows: ``at[row]`` is the row's place in the columns (-1: none)."""

    SHARED_DETAILS = 50_000  # distinct detail texts parsed once and shared; past that, each its own

    def __init__(self, n: int) -> None:
        self.at = array("i", [-1]) * n
        self.cols = [Column() for _ in range(4)]  # version, value, passed, explanation
        self.detail: list[dict[str, Any]] = []

    def add(self, items: list[tuple[int, tuple[Any, ...]]], details: dict[str | None, Any]) -> None:
        base = len(self.detail)
        for k, (i, _) in enumerate(items):
            self.at[i] = base + k
        for j, c in enumerate(self.cols, start=2):
            c.extend([g[j] for _, g in items])
        for _, g in items:
            d = details.get(g[6])
            if d is None:
                d = json.loads(g[6] or "{}")
                if len(details) < self.SHARED_DETAILS:
                    details[g[6]] = d
            self.detail.append(d)


def table_of(rows: list[Any]) -> Table | None:
    """The one `Table` every row is a view of, else None (rows made by hand, or mixed)."""
    if isinstance(rows, Rows) and rows.parts is not None:  # views made when read: no row to look at
        ts = {id(t): t for t, _ in rows.parts}
        return next(iter(ts.values())) if len(ts) == 1 else None
    t = getattr(rows[0], "_t", None) if rows else None
    if t is None or not all(type(r) is Row and r._t is t for r in rows):
        return None
    return t  # type: ignore[no-any-return]


def row_index(rows: list[Any]) -> tuple[Table, np.ndarray] | None:
    """(the table, each row's place in it) when the rows are views of one table, else None."""
    t = table_of(rows)
    if t is None:
        return None
    if isinstance(rows, Rows) and rows.parts is not None:
        return t, np.concatenate([np.arange(t.n) if idx is None else idx.astype(np.int64) for _, idx in rows.parts])
    return t, np.fromiter((r._i for r in rows), dtype=np.int64, count=len(rows))
