"""A ledger's files, handled the way SQLite says they must be (sqlite.org/howtocorrupt.html): a
ledger is copied only through SQLite's backup API, never byte by byte (closing a copy's file
descriptor drops every POSIX lock this process holds on the original, and another process then
checkpoints and unlinks a `-wal` that live connections still use); a new file is built beside its
final name and renamed into place; and a name whose `-wal`, `-shm` or `-journal` is left over
from another database is refused (SQLite would replay those pages into the new file)."""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import LedgerError, LedgerWriteError, UsageError

SIDE_FILES = ("-wal", "-shm", "-journal")


def side_files(path: Path) -> list[Path]:
    """The journal files SQLite keeps beside ``path`` that exist now."""
    return [p for p in (Path(f"{path}{s}") for s in SIDE_FILES) if p.exists()]


def refuse_leftovers(path: Path, what: str) -> None:
    """A new database at ``path`` would inherit another database's journal: refuse, in one line."""
    left = side_files(path)
    if left:
        raise UsageError(f"{what}: {left[0]} is left over from an earlier database at {path.name} (a writer that was "
                         f"killed, or a file deleted without its journal); SQLite would replay it into the new file: "
                         f"move it away, or open {path.name}'s old database once to recover it")


def beside(path: Path, tag: str) -> Path:
    """A temporary name in the same folder (so the final rename is atomic), unique to this call."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(3)}")


def remove_database(path: Path) -> None:
    """Delete a database this process built and closed, with whatever journal files it left."""
    for p in (path, *(Path(f"{path}{s}") for s in SIDE_FILES)):
        p.unlink(missing_ok=True)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write ``path`` (no migration, no journal-mode change, no
    checkpoint): what merge, copy and every reader of someone else's ledger use."""
    if not path.exists():
        raise LedgerError(f"{path}: ledger not found")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        conn.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise LedgerError(f"{path}: not a SQLite database ({e})") from None
    return conn


def finish_into(tmp: Path, out: Path) -> None:
    """Make ``tmp`` (closed, built beside ``out``) the file at ``out``: flushed to disk in
    rollback-journal mode (one self-contained file), then renamed in one step. A kill before the
    rename leaves ``out`` as it was; after it, ``out`` is whole."""
    conn = sqlite3.connect(str(tmp), timeout=30)
    try:
        conn.execute("pragma wal_checkpoint(truncate)")
        conn.execute("pragma journal_mode=delete")  # the -wal folded in and removed: nothing to carry beside it
    finally:
        conn.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    refuse_leftovers(out, "write")  # checked again at the last moment: another process may have left one
    os.replace(tmp, out)
    dfd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself is durable
    finally:
        os.close(dfd)


@contextmanager
def new_database(out: Path, what: str, *, replace: bool = False) -> Iterator[Path]:
    """Build a new database for ``out``: yields a temporary path beside it; when the block ends
    without an error the database there becomes ``out`` (`finish_into`), else it is removed.
    ``out`` existing is refused unless ``replace``; a leftover journal at ``out`` always is."""
    if out.exists() and not replace:
        raise UsageError(f"{what}: {out} exists; choose a new file")
    refuse_leftovers(out, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = beside(out, what.split()[-1])
    try:
        yield tmp
        finish_into(tmp, out)
    finally:
        remove_database(tmp)


def copy_ledger(src: Path, dst: Path, *, replace: bool = False) -> Path:
    """The one way to copy a ledger, live or not: SQLite's backup API from a read-only connection
    (a consistent snapshot, the rows still in the source's `-wal` included, no lock of the source
    dropped), into a file beside ``dst`` renamed into place. Returns ``dst``."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.resolve() == dst.resolve():
        raise UsageError(f"copy: {dst} is the ledger being copied")
    source = connect_read_only(src)
    try:
        with new_database(dst, "ledger copy", replace=replace) as tmp:
            target = sqlite3.connect(str(tmp))
            try:
                source.backup(target)
            except sqlite3.OperationalError as e:
                raise LedgerWriteError(f"{dst}: cannot write the copy ({e})") from None
            finally:
                target.close()
    finally:
        source.close()
    return dst
