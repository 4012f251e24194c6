"""The ledger's columnar copy (issue 48): the tables the analysis queries read (requests, grades,
runs, cases) copied once per ledger state into a DuckDB file beside the ledger, so each query
reads DuckDB's own column storage instead of scanning the SQLite file again through the sqlite
extension (a query over 10 M rows spent most of its 20-30 s in that scan).

The copy is keyed by the ledger's change count and tags (migration m028: every insert, update or
delete of a row of a copied table, by any writer, counts one; an insert draws a new random tail
tag, an update or delete a new random tag) and by its migrations; the key is read *before* the
rows are copied, so a write during the copy leaves a copy whose key is already stale, never one
that looks fresh and is not. Where only inserts happened since (same tag: a run that went on, new
grades), a new copy is made from the old one with the requests and grades past its last id appended, after
checking that its last row is still the ledger's. A copy is written under a temporary name and renamed, so a
reader never sees half of one; it is only ever read by DuckDB (attached read-only) and never
touches the ledger, which the copy's builder attaches read-only too. Where no copy can be written
(a read-only folder, a full disk, a value DuckDB cannot type), queries read the ledger as before.

The copy also holds ``grade_superseded`` (`views.SUPERSEDED`): the ids of the grades a newer one
replaced, so the newest grades are kept by an anti-join on a short list rather than by grouping
every grade in each query (at 10 M requests, 25 M grades).

In a query's connection the ledger is attached as ``s``, the copy as ``c``, and schema ``l`` holds
a view per table and view of the ledger: the copied tables and the views over them
(``l.measured``, ``l.grade_latest``, ``l.grade_superseded``) read the copy, the rest read the
ledger; without a copy every view reads the ledger. The queries name ``l.x`` either way."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .views import APPENDED, COPIED, COPY_VIEWS, SUPERSEDED

META = "evalkit_copy"
LAYOUT = 2  # what a copy holds; one of another layout is made again (1: no `grade_superseded`)
Key = tuple[int, int, int, int]  # (changes, tag, tail, migrations)
_FAILED: set[tuple[str, Key]] = set()  # (copy, ledger state) this process could not make
_TMP = re.compile(r"\.columns\.duckdb\.tmp-(\d+)(\.wal)?$")


def copy_path(ledger: str | Path) -> Path:
    """Where the copy of ``ledger`` lives: a hidden file beside it."""
    p = Path(ledger)
    return p.with_name(f".{p.name}.columns.duckdb")


def ledger_key(con: Any) -> Key | None:
    """(changes, tag, tail, migrations) of the ledger attached as ``s`` on ``con``; None for a
    ledger from before migration m028 (read as it is, never copied)."""
    try:
        n, tag, tail = con.execute("select n, tag, tail from s.ledger_changes where id = 1").fetchone()
    except Exception:  # noqa: BLE001  (no such table: an older ledger, opened read-only)
        return None
    (m,) = con.execute("select count(*) from s._sqlite_migrations").fetchone()
    return int(n), int(tag), int(tail), int(m)


def _key_of(con: Any, alias: str) -> Key | None:
    try:
        row = con.execute(f"select n, tag, tail, migrations, layout from {alias}.{META}").fetchone()
    except Exception:  # noqa: BLE001  (not a copy of ours, or an older layout: made again)
        return None
    return None if row is None or row[4] != LAYOUT else (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def attach_fresh(con: Any, ledger: str | Path, key: Key, memory_limit: str, extension: Path) -> bool:
    """Attach a copy of the ledger in state ``key`` as ``c`` on ``con``, bringing the one beside
    the ledger up to date first where it is missing or stale (``extension``: the sqlite
    extension, `duck.extension_path`); False where none could be made."""
    path = copy_path(ledger)
    if path.is_file() and _attach_if(con, path, key):
        return True
    if (str(path), key) in _FAILED or path.is_dir() or not os.access(path.parent, os.W_OK):
        return False  # never a second try in this process: a copy of 10 M rows takes minutes
    try:
        extended = path.is_file() and _write(ledger, path, key, memory_limit, extension, _extend)
    except Exception:  # noqa: BLE001  (e.g. a column the ledger gained since: made whole instead)
        extended = False
    try:
        if not extended:
            _write(ledger, path, key, memory_limit, extension, _fill)
    except Exception:  # noqa: BLE001  (no copy: the queries read the ledger itself, as before)
        _FAILED.add((str(path), key))
        return False
    return _attach_if(con, path, key)


def _quoted(path: str | Path) -> str:
    """A path as an SQL string (ATTACH takes no parameter)."""
    return "'" + str(path).replace("'", "''") + "'"


def _attach_if(con: Any, path: Path, key: Key) -> bool:
    try:
        con.execute(f"ATTACH {_quoted(path)} AS c (READ_ONLY)")
    except Exception:  # noqa: BLE001  (a damaged or foreign file: made again)
        return False
    if _key_of(con, "c") == key:
        return True
    con.execute("DETACH c")
    return False


def _fill(con: Any, key: Key) -> bool:
    """The whole copy: the ledger's `COPIED` tables (every column, in the ledger's order) and the
    views over them."""
    for table in COPIED:  # one thread: the rows keep the ledger's order, so sums add up alike
        con.execute(f"create table {table} as select * from s.{table}")
    con.execute("create table grade_superseded as " + SUPERSEDED.format(grades="grades", new="", least=1))
    _views_and_key(con, key)
    return True


def _views_and_key(con: Any, key: Key) -> None:
    for name, sql in COPY_VIEWS.items():
        con.execute(f"create view {name} as {sql}")
    con.execute(f"create table {META} (n bigint, tag bigint, tail bigint, migrations bigint, layout bigint)")
    con.execute(f"insert into {META} values ({', '.join(str(k) for k in (*key, LAYOUT))})")


def _extend(con: Any, key: Key) -> bool:
    """A new copy made from the older one (attached read-only as ``o``) where the ledger has only
    had rows inserted since: its requests and grades read from DuckDB's own storage and the rows
    past its last id appended, the small tables copied again. False (nothing kept) where a row
    was updated or deleted, the migrations differ, or its last row is not the ledger's (another
    history). DuckDB reads and writes it: a file is never copied byte for byte."""
    old = _key_of(con, "o")
    if old is None or (old[1], old[3]) != (key[1], key[3]) or old[0] >= key[0]:
        return False
    tops = {}
    for table in APPENDED:
        (top,) = con.execute(f"select max(id) from o.{table}").fetchone()
        if top is not None and con.execute(f"select hash(t) from o.{table} t where id = {int(top)}").fetchall() != \
                con.execute(f"select hash(t) from s.{table} t where id = {int(top)}").fetchall():
            return False
        tops[table] = -1 if top is None else int(top)
    for table in COPIED:
        if table in tops:  # one thread: the older rows first, then the new ones in the ledger's order
            con.execute(f"create table {table} as select * from o.{table}")
            con.execute(f"insert into {table} select * from s.{table} where id > {tops[table]}")
        else:
            con.execute(f"create table {table} as select * from s.{table}")
    # the old copy's replaced grades, and those a grade appended replaced (grouping the new grades only)
    con.execute("create table grade_superseded as select id from o.grade_superseded union "
                + SUPERSEDED.format(grades="grades", new=f" and id > {tops['grades']}", least=0) + " order by id")
    _views_and_key(con, key)
    return True


def _write(ledger: str | Path, path: Path, key: Key, memory_limit: str, extension: Path, fill: Any) -> bool:
    """Make the copy under a temporary name beside ``path`` (``_extend`` reads the current one,
    attached read-only as ``o``), ``fill`` it with the ledger attached as ``s`` and rename it into place; False where
    ``fill`` declined (nothing changed)."""
    import duckdb

    _sweep(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(tmp), config={"autoinstall_known_extensions": False,
                                               "autoload_known_extensions": False, "threads": 1})
        try:
            con.execute(f"set memory_limit = {_quoted(memory_limit)}")
            con.execute("set enable_progress_bar = false")
            con.execute(f"LOAD {_quoted(extension)}")
            con.execute(f"ATTACH {_quoted(ledger)} AS s (TYPE sqlite, READ_ONLY)")
            if fill is _extend:
                con.execute(f"ATTACH {_quoted(path)} AS o (READ_ONLY)")
            done = fill(con, key)
            con.execute("DETACH DATABASE IF EXISTS o")
            con.execute("DETACH s")
        finally:
            con.close()
        if done:
            os.replace(tmp, path)  # made beside and renamed: a reader never sees half of it
        return bool(done)
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)


def _sweep(path: Path) -> None:
    """Remove half-made copies whose builder is gone (killed while copying)."""
    for p in path.parent.glob(f"{path.name}.tmp-*"):
        m = _TMP.search(p.name)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except PermissionError:  # another user's live process
            continue
