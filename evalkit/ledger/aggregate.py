"""Rows in bulk, for reports at any size and for benchmarks that build large ledgers: a mixin of
`Ledger`. Needs the Ledger's private ``_db``."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from sqlite_utils import Database

from .writes import _write


class ReportReads:
    """What a report (or a benchmark that builds a ledger) asks of many rows without holding them."""

    _db: Database

    def request_ids(self, run_id: str, first_seq: int, last_seq: int) -> list[int]:
        """The ids of a run's requests with ``first_seq`` <= seq <= ``last_seq``, in seq order."""
        return [r[0] for r in self._db.execute(
            "select id from requests where run_id = ? and seq between ? and ? order by seq, id",
            [run_id, first_seq, last_seq])]

    def measured_chunks(self, run_id: str, leave_out: Collection[str] = (), size: int = 20_000,
                        variant: str | None = None, level: int | None = None,
                        seqs: tuple[int, int] | None = None, only: Collection[str] | None = None,
                        ids: Sequence[int] | None = None) -> Iterator[tuple[list[str], list[tuple[Any, ...]]]]:
        """The measured rows of `Ledger.iter_measured` (``with_cases=False``: the same rows and order)
        as (column names, a chunk of tuples): no dict per row. ``leave_out``: columns not read (the
        lean read's `HEAVY_FIELDS | UNREPORTED`). ``variant``, ``level``: one slice's rows only
        (``level`` as the report counts it: the concurrency, 1 when none); ``seqs``: those with
        first <= seq <= last (`seq_ranges`); ``only``: these columns alone (of those not left out);
        ``ids``: these requests only (`noted_ids`)."""
        cols = [c for c in self._db["requests"].columns_dict if c not in leave_out and (only is None or c in only)]
        where, params = _slice_where(run_id, variant, level, seqs, ids)
        cur = self._db.execute(
            f"""select {', '.join(f'r.[{c}]' for c in cols)} from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where {where} order by r.seq, r.id""", params)
        while chunk := cur.fetchmany(size):
            yield cols, chunk

    def latest_grade_chunks(self, run_id: str, size: int = 20_000, variant: str | None = None,
                            level: int | None = None, seqs: tuple[int, int] | None = None,
                            graders: Collection[str] | None = None, ids: Sequence[int] | None = None
                            ) -> Iterator[list[tuple[Any, ...]]]:
        """`Ledger.latest_grades` as chunks of (request id, grader, version, value, passed,
        explanation, detail JSON) tuples: the newest grade without an error per request and grader.
        ``variant``, ``level``, ``ids``: of one slice's measured requests only; ``graders``: theirs only."""
        names = sorted(graders) if graders is not None else None
        # unary + keeps the planner off an index on grader (with it, a slice's read scanned every grade)
        which = "" if names is None else f" and +g.grader in ({', '.join('?' * len(names))})"
        cols = "g.request_id, g.grader, g.grader_version, g.value, g.passed, g.explanation, g.detail_json"
        if variant is None and level is None and seqs is None and ids is None:
            sql, params = f"select {cols} from grade_latest g where g.run_id = ?{which}", [run_id]
        else:
            where, params = _slice_where(run_id, variant, level, seqs, ids)
            # from the slice's requests to their grades (CROSS JOIN keeps that order): the planner's
            # own choice scanned every grade of the run for each slice, quadratic in a long run
            sql = (f"select {cols} from measured r cross join grade_latest g on g.request_id = r.id where {where} "
                   f"and g.run_id = r.run_id{which}")
        cur = self._db.execute(sql, params + (names or []))
        while chunk := cur.fetchmany(size):
            yield chunk

    def noted_ids(self, run_id: str, grader: str, fields: Sequence[str]) -> list[int]:
        """The measured requests, in send order, whose newest grade by ``grader`` has one of these
        detail ``fields`` set (not null, false, 0 or ""): the rows a grader's `notes` can speak of,
        when it declares them (`Aggregate.notes_where`)."""
        if not fields or any(not f.isidentifier() for f in fields):
            raise ValueError(f"notes_where of {grader!r}: detail keys, letters, digits and _ only")
        cond = " or ".join(f"coalesce(json_extract(g.detail_json, '$.{f}'), 0) not in (0, '')" for f in fields)
        return [r[0] for r in self._db.execute(
            f"""select r.id from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                join grade_latest g on g.request_id = r.id
                where r.run_id = ? and g.grader = ? and ({cond}) order by r.seq, r.id""", [run_id, grader])]

    def measured_e2e(self, run_id: str) -> tuple[float, int]:
        """(the E2E milliseconds of a run's measured requests added up, its distinct cases), in SQL."""
        total, cases = self._db.execute("select coalesce(sum(e2e_ms), 0.0), count(distinct case_id) from measured "
                                        "where run_id = ?", [run_id]).fetchone()
        return float(total), int(cases)

    def _unchanged(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, or a copy of its last answer while the ledger is unchanged (no write by this
        connection, none by another: `total_changes`, `data_version`): a report, its findings and
        its charts ask the same aggregate over millions of rows (~10-20 s each at 2 M)."""
        conn = self._db.conn
        version = (conn.total_changes, conn.execute("pragma data_version").fetchone()[0])
        memo: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_aggregate_memo", {})
        hit = memo.get(key)
        if hit is None or hit[0] != version:
            hit = memo[key] = (version, compute())
        return copy.deepcopy(hit[1])  # callers may change what they get

    def slice_levels(self, run_id: str) -> dict[str, set[int]]:
        """variant -> the load levels (concurrency, 1 when none) of its measured rows, by SQL; the
        variants in the order the rows (by seq) first show them."""
        return self._unchanged(("slice_levels", run_id), lambda: self._slice_levels(run_id))  # type: ignore[no-any-return]

    def _slice_levels(self, run_id: str) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for v, lv, _, _ in self.query(f"select r.variant, r.load_level, min(r.seq), min(r.id) {_MEASURED} "  # type: ignore[attr-defined]
                                      "where r.run_id = $run group by 1, 2 order by 3 nulls first, 4", {"run": run_id})[1]:
            out.setdefault(v, set()).add(lv)
        return out

    def seq_ranges(self, run_id: str, size: int = 50_000) -> list[tuple[int, int]]:
        """(first, last) seq of consecutive stretches of the measured rows, about ``size`` rows
        each (a seq is never split): an ordered pass over the run a stretch at a time."""
        out: list[tuple[int, int]] = []
        lo = last = None
        n = 0
        for (seq,) in self._db.execute(
                "select r.seq from measured r where r.run_id = ? order by r.seq", [run_id]):
            if lo is None:
                lo = seq
            elif n >= size and seq != last:
                out.append((lo, last))  # type: ignore[arg-type]
                lo, n = seq, 0
            last, n = seq, n + 1
        if lo is not None:
            out.append((lo, last))  # type: ignore[arg-type]
        return out

    def slice_repeats(self, run_id: str, variant: str, level: int) -> set[int]:
        """The repeats of one variant's measured rows at one level."""
        where, params = _slice_where(run_id, variant, level)
        return {rep for (rep,) in self._db.execute(
            f"""select distinct r.repeat from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash where {where}""", params)}

    def measured_graders(self, run_id: str) -> set[str]:
        """The graders with a grade (no error) of at least one measured request (the report's
        tables and its findings both ask: 1.9 s at 1 M rows)."""
        return self._unchanged(("measured_graders", run_id), lambda: self._measured_graders(run_id))  # type: ignore[no-any-return]

    def _measured_graders(self, run_id: str) -> set[str]:
        return {g for (g,) in self.query(  # type: ignore[attr-defined]
            f"select distinct g.grader from l.grades g join (select r.id {_MEASURED} where r.run_id = $run) r "
            "on r.id = g.request_id where g.run_id = $run and g.error_class is null", {"run": run_id})[1]}

    def measured_columns(self, run_id: str, names: list[str], size: int = 50_000
                         ) -> Iterator[list[tuple[Any, ...]]]:
        """A few columns of every measured row, in the report's order (seq, id), a chunk at a time:
        one ordered pass that holds a chunk. A column the ledger lacks reads as NULL."""
        have = self._db["requests"].columns_dict
        sel = ", ".join(f"r.[{c}]" if c in have else "null" for c in names)
        cur = self._db.execute(
            f"""select {sel} from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where r.run_id = ? order by r.seq, r.id""", [run_id])
        while chunk := cur.fetchmany(size):
            yield chunk

    def level_outline(self, run_id: str) -> dict[str, Any]:
        """What a report read one variant x load level at a time needs from the other levels, by
        SQL over the measured rows: ``spans`` (variant, level label) -> replica -> (first send, last
        end), replicas in the order the rows first show them; ``traced`` variant -> its rows of a
        replayed trace."""
        return self._unchanged(("level_outline", run_id), lambda: self._level_outline(run_id))  # type: ignore[no-any-return]

    def _level_outline(self, run_id: str) -> dict[str, Any]:
        label = "coalesce(nullif(r.level, ''), 'main')"
        spans: dict[tuple[str, str], dict[Any, tuple[float, float]]] = {}
        for v, lab, rep, lo, hi, _, _ in self.query(  # type: ignore[attr-defined]
                f"""select r.variant, {label}, r.replica, min(r.mono_start_ms),
                           max(r.mono_start_ms + coalesce(r.e2e_ms, 0.0)), min(r.seq), min(r.id)
                    {_MEASURED} where r.run_id = $run and r.mono_start_ms is not null
                    group by 1, 2, 3 order by 6 nulls first, 7""",
                {"run": run_id})[1]:
            spans.setdefault((v, lab), {})[rep] = (lo, hi)
        trace = "count(r.trace_row)" if "trace_row" in self._db["requests"].columns_dict else "0"
        _, rows = self.query(f"select r.variant, {trace} {_MEASURED} where r.run_id = $run group by 1",  # type: ignore[attr-defined]
                             {"run": run_id})
        return {"spans": spans, "traced": {v: int(n) for v, n in rows}}

    def trace_rows(self, run_id: str, variant: str, size: int = 20_000) -> Iterator[dict[str, Any]]:
        """One variant's measured rows of a replayed trace in trace order (then seq, id: the order
        a stable sort of the run's rows gives), with what trace fidelity reads, a chunk at a time."""
        names = ["scheduled_ms", "sent_ms", "error_class", "prompt_tokens", "completion_tokens",
                 "trace_input_tokens", "trace_output_tokens"]
        have = self._db["requests"].columns_dict
        if "trace_row" not in have:
            return
        where, params = _slice_where(run_id, variant, None)
        cur = self._db.execute(
            f"""select {', '.join(f'r.[{c}]' if c in have else 'null' for c in names)} from measured r
                join runs u on u.id = r.run_id join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where {where} and r.trace_row is not null order by r.trace_row, r.seq, r.id""", params)
        while chunk := cur.fetchmany(size):
            for row in chunk:
                yield dict(zip(names, row, strict=True))

    @_write
    def insert_grade_rows(self, rows: list[dict[str, Any]]) -> None:
        """Grades in one transaction by plain inserts (the table exists: no type detection per
        chunk, ~10x faster than `insert_grades` for a synthesized million)."""
        if not rows:
            return
        cols = sorted({k for r in rows for k in r})
        sql = f"insert into grades ({', '.join(f'[{c}]' for c in cols)}) values ({', '.join('?' for _ in cols)})"
        with self._db.conn:
            self._db.conn.executemany(sql, [tuple(r.get(c) for c in cols) for r in rows])


# a run's measured rows of its own cases, as every analysis query reads them (DuckDB, the ledger's `l` schema)
_MEASURED = ("from l.measured r join l.runs u on u.id = r.run_id "
             "join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash")


def _slice_where(run_id: str, variant: str | None, level: int | None, seqs: tuple[int, int] | None = None,
                 ids: Sequence[int] | None = None) -> tuple[str, list[Any]]:
    """The conditions on `measured r` that pick one run's slice (``level``: its `load_level`)."""
    where, params = ["r.run_id = ?"], [run_id]  # of the `measured` view
    if variant is not None:
        where.append("r.variant = ?")
        params.append(variant)
    if level is not None:
        where.append("r.load_level = ?")
        params.append(level)
    if seqs is not None:
        where.append("r.seq between ? and ?")
        params.extend(seqs)
    if ids is not None:  # one parameter, however many
        where.append("r.id in (select value from json_each(?))")
        params.append(json.dumps([int(i) for i in ids]))
    return " and ".join(where), params
