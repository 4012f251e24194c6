"""The derived tables (`derived_*`: findings that need Python, stored for Datasette) and the
`requests_joined` view: a mixin of `Ledger`. Needs the Ledger's private ``_db`` and ``run_ids``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from .views import requests_view_sql
from .writes import _write, utcnow


class DerivedTables:
    """A run's derived tables, kept with the signature of what they were computed from."""

    _db: Database
    path: Path
    run_ids: Callable[[], list[str]]  # Ledger's

    def derived_signature(self, run_id: str) -> str:
        """What a run's derived tables were computed from: its status, its newest request and its
        newest grade. A different signature means they are stale."""
        run = self._db.execute("select status from runs where id = ?", [run_id]).fetchone()
        req = self._db.execute("select max(id), count(*) from requests where run_id = ?", [run_id]).fetchone()
        grade = self._db.execute("select max(id), count(*) from grades where run_id = ?", [run_id]).fetchone()
        return f"{run[0] if run else None}|{req[0]}|{req[1]}|{grade[0]}|{grade[1]}"

    def stale_derived(self) -> list[str]:
        """The runs whose derived tables are missing or older than their rows, grades or status."""
        done = {r["run_id"]: r["signature"] for r in self._db.query("select run_id, signature from derived_runs")}
        return [rid for rid in self.run_ids() if done.get(rid) != self.derived_signature(rid)]

    @_write
    def replace_derived(self, run_id: str, spikes: Iterable[dict[str, Any]], summary: Iterable[dict[str, Any]],
                        cost: Iterable[dict[str, Any]] | None = None, verdicts: Iterable[dict[str, Any]] | None = None
                        ) -> None:
        """One run's findings that need Python (robust statistics), for Datasette, in one
        transaction, with the signature they were computed from. Rows are taken as inserted (a
        large run's spikes are never all dicts at once)."""
        signature = self.derived_signature(run_id)
        with self._db.conn:
            for table, rows in (("derived_spikes", spikes), ("derived_summary", summary), ("derived_cost", cost or []),
                                ("derived_verdicts", verdicts or [])):
                self._db[table].delete_where("run_id = ?", [run_id])
                cols = list(self._db[table].columns_dict)  # the migrations made these tables: plain inserts
                self._db.conn.executemany(f"insert into [{table}] ({', '.join(f'[{c}]' for c in cols)}) values "
                                          f"({', '.join('?' * len(cols))})", (tuple(r.get(c) for c in cols) for r in rows))
            self._db["derived_runs"].upsert({"run_id": run_id, "signature": signature, "computed_at": utcnow()},
                                            pk="run_id")

    @_write
    def define_requests_view(self, grade_columns: Iterable[tuple[str, str, str]]) -> None:
        """(Re)create `requests_joined` with one column per (column, grader, field) given."""
        with self._db.conn:
            self._db.execute("drop view if exists requests_joined")
            self._db.execute(requests_view_sql(grade_columns))
