"""Opening a ledger: migrated in one `open_ledger()` (WAL mode), or read-only for a file this
process must not change; and the register of every ledger this process has open, which the test
suite reads to fail a command that leaves one open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database

from ..errors import LedgerError, LedgerWriteError, OldLedgerSchema
from .files import connect_read_only
from .migrations import MIGRATION_NAMES, MIGRATION_SET, migrations
from .register import LEAKED, open_ledgers
from .store import Ledger

__all__ = ["LEAKED", "needs_migration", "open_ledger", "open_ledgers"]


def _check_is_ledger(db: Database, path: Path) -> None:
    tables = set(db.table_names())
    if not tables:
        return  # a blank database: migrations will make it a ledger
    if "_sqlite_migrations" not in tables or not db.execute(
        "select count(*) from _sqlite_migrations where migration_set = ?", [MIGRATION_SET]
    ).fetchone()[0]:
        raise LedgerError(f"{path}: not an evalkit ledger (it has tables but no evalkit migrations)")
    known = set(MIGRATION_NAMES)
    applied = {m.name for m in migrations.applied(db)}
    newer = sorted(applied - known)
    if newer:
        raise LedgerError(
            f"{path}: ledger was written by a newer evalkit (unknown migrations: {', '.join(newer)}); upgrade evalkit"
        )


def open_ledger(path: str | Path, *, create: bool = True, read_only: bool = False) -> Ledger:
    """Open a ledger, migrate it to the current schema, and return it (WAL mode); use it as a
    context manager, so it is closed. ``read_only``: nothing is written to the file, not even a
    migration (a ledger of an older schema is refused: read it through a migrated copy)."""
    p = Path(path)
    if not create and not p.exists():
        raise LedgerError(f"{p}: ledger not found (run `evalkit run` first, or pass --ledger)")
    if read_only:
        return _open_read_only(p)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(p), timeout=30)
    try:
        db = Database(conn)
        db.execute("select count(*) from sqlite_master").fetchone()
        _check_is_ledger(db, p)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise LedgerError(f"{p}: not a SQLite database ({e})") from None
    except BaseException:
        conn.close()
        raise
    # WAL: a reader (Datasette, report) never blocks the writer; each row is its own transaction.
    try:
        db.execute("pragma journal_mode=wal")
        db.execute("pragma synchronous=normal")
        migrations.apply(db)
    except sqlite3.OperationalError as e:  # a full disk or a read-only file: nothing was half written
        conn.close()
        raise LedgerWriteError(f"{p}: cannot write the ledger ({e})") from None
    except BaseException:
        conn.close()
        raise
    return Ledger(db, p)


def needs_migration(db: Database) -> bool:
    """Whether a ledger lacks a migration this evalkit applies."""
    return bool(set(MIGRATION_NAMES) - {m.name for m in migrations.applied(db)})


def _open_read_only(p: Path) -> Ledger:
    conn = connect_read_only(p)
    db = Database(conn)
    try:
        _check_is_ledger(db, p)
        if not db.table_names():
            raise LedgerError(f"{p}: an empty database, not a ledger")
        if needs_migration(db):
            raise OldLedgerSchema(f"{p}: a ledger of an older evalkit schema; read it through a migrated copy "
                              "(`evalkit ledger migrate`, or merge, which does so itself)")
    except BaseException:
        conn.close()
        raise
    return Ledger(db, p)


def applied_migrations(path: Path) -> int:
    """How many of evalkit's migrations a ledger file has, read without writing it."""
    conn = connect_read_only(path)
    try:
        db = Database(conn)
        return len(migrations.applied(db)) if "_sqlite_migrations" in db.table_names() else 0
    finally:
        conn.close()


def integrity(path: Path) -> list[str]:
    """SQLite's `integrity_check` of a file, read-only: [] when it is whole, else what is wrong."""
    conn = connect_read_only(path)
    try:
        rows = [r[0] for r in conn.execute("pragma integrity_check")]
    except sqlite3.DatabaseError as e:
        return [str(e)]
    finally:
        conn.close()
    return [] if rows == ["ok"] else rows
