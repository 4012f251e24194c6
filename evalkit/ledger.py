"""The SQLite ledger: one file, opened (and migrated) in exactly one place."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from .errors import LedgerError
from .migrations import MIGRATION_SET, migrations


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _check_is_ledger(db: Database, path: Path) -> None:
    tables = set(db.table_names())
    if not tables:
        return  # a blank database: migrations will make it a ledger
    if "_sqlite_migrations" not in tables or not db.execute(
        "select count(*) from _sqlite_migrations where migration_set = ?", [MIGRATION_SET]
    ).fetchone()[0]:
        raise LedgerError(f"{path}: not an evalkit ledger (it has tables but no evalkit migrations)")
    known = {m.name for m in migrations._migrations}
    applied = {m.name for m in migrations.applied(db)}
    newer = sorted(applied - known)
    if newer:
        raise LedgerError(
            f"{path}: ledger was written by a newer evalkit (unknown migrations: {', '.join(newer)}); upgrade evalkit"
        )


def open_ledger(path: str | Path, *, create: bool = True) -> Database:
    """Open a ledger, migrate it to the current schema, and return it (WAL mode)."""
    p = Path(path)
    if not create and not p.exists():
        raise LedgerError(f"{p}: ledger not found (run `evalkit run` first, or pass --ledger)")
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(p), timeout=30)
        db = Database(conn)
        db.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise LedgerError(f"{p}: not a SQLite database ({e})") from None
    _check_is_ledger(db, p)
    # WAL: a reader (Datasette, report) never blocks the writer; each row is its own transaction.
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=normal")
    migrations.apply(db)
    return db


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
