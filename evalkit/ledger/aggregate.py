"""Rows in bulk, for reports at any size and for benchmarks that build large ledgers: a mixin of
`Ledger`. Needs the Ledger's private ``_db``."""

from __future__ import annotations

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
