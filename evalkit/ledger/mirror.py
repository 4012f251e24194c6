"""A ledger that mirrors its writes: it writes locally (the runner reads some rows back) and hands
every write that belongs in another process's ledger to a callback as an event tuple. A Ray
worker runs the ordinary runner against one of these (in memory); the driver applies the events
to the real ledger with `apply_event`, so one process alone writes the file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .store import Ledger, open_ledger

Event = tuple[Any, ...]


class MirroredLedger(Ledger):
    def __init__(self, emit: Callable[[Event], None], path: str = ":memory:") -> None:
        inner = open_ledger(path)
        super().__init__(inner._db, inner.path)
        self.emit = emit

    def seed_run(self, run_row: dict[str, Any], case_rows: list[dict[str, Any]]) -> None:
        """The run and its cases, as the driver has them: rows written here join to these."""
        self._db["runs"].insert(run_row)
        self.record_cases(case_rows)

    def upsert_variant(self, row: dict[str, Any]) -> None:
        super().upsert_variant(row)
        self.emit(("upsert_variant", row))

    def update_variant(self, vid: str, fields: dict[str, Any]) -> None:
        super().update_variant(vid, fields)
        self.emit(("update_variant", vid, fields))

    def upsert_replica(self, row: dict[str, Any]) -> None:
        super().upsert_replica(row)
        self.emit(("upsert_replica", row))

    def insert_request(self, row: dict[str, Any]) -> int:
        rid = super().insert_request(row)
        self.emit(("insert_request", rid, row))
        return rid

    def update_request(self, request_id: int, fields: dict[str, Any]) -> None:
        super().update_request(request_id, fields)
        self.emit(("update_request", request_id, fields))

    def insert_server_samples(self, rows: list[dict[str, Any]]) -> None:
        super().insert_server_samples(rows)
        if rows:
            self.emit(("server_samples", rows))
