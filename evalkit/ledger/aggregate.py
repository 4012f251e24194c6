"""Rows in bulk, for reports at any size and for benchmarks that build large ledgers: a mixin of
`Ledger`. Needs the Ledger's private ``_db``."""

from __future__ import annotations

from collections.abc import Collection, Iterator
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

    def measured_chunks(self, run_id: str, leave_out: Collection[str] = (), size: int = 20_000
                        ) -> Iterator[tuple[list[str], list[tuple[Any, ...]]]]:
        """The measured rows of `Ledger.iter_measured` (``with_cases=False``: the same rows and order)
        as (column names, a chunk of tuples): no dict per row. ``leave_out``: columns not read (the
        lean read's `HEAVY_FIELDS | UNREPORTED`)."""
        cols = [c for c in self._db["requests"].columns_dict if c not in leave_out]
        cur = self._db.execute(
            f"""select {', '.join(f'r.[{c}]' for c in cols)} from requests r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where r.run_id = ? and r.is_warmup = 0 and r.final = 1 order by r.seq, r.id""", [run_id])
        while chunk := cur.fetchmany(size):
            yield cols, chunk

    def latest_grade_chunks(self, run_id: str, size: int = 20_000) -> Iterator[list[tuple[Any, ...]]]:
        """`Ledger.latest_grades` as chunks of (request id, grader, version, value, passed,
        explanation, detail JSON) tuples: the newest grade without an error per request and grader."""
        cur = self._db.execute(
            """select g.request_id, g.grader, g.grader_version, g.value, g.passed, g.explanation, g.detail_json
               from grades g join (select max(id) as id from grades where run_id = ? and error_class is null
                                   group by request_id, grader) m
               on m.id = g.id""", [run_id])
        while chunk := cur.fetchmany(size):
            yield chunk

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
