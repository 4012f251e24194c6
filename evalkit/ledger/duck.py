"""DuckDB over the ledger file (issue 48): aggregates computed where the data is, by a columnar
engine, so Python sees only their results. The ledger is attached read-only through DuckDB's
sqlite extension, loaded from its PyPI wheel (`duckdb-extension-sqlite`, the same version as
`duckdb`), with extension auto-install and auto-load off: nothing is fetched, ever.

The wheel ships the extension as `sqlite.duckdb_extension`, but its entry point is named for
`sqlite_scanner`, and DuckDB derives the entry point from the file name: it is loaded through a
link named `sqlite_scanner.duckdb_extension` (made beside and renamed, once per user)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import EvalkitError

EXTENSION = "sqlite_scanner.duckdb_extension"
# DuckDB's buffer pool: a join, sort, window or temp table past it spills to disk (a per-case join at
# 10 M rows: 1.5 GB peak without it, 377 MB with 256 MB). Percentile states and ordered lists are
# not in the pool: they hold their values. 128 MB: quality under load's pairs at 1 M rows peaked at
# 295 MB in the worker (399 MB with 256 MB), in about the same time.
MEMORY_LIMIT = "128MB"
# What a statement that runs out of that memory is retried with, in turn (the query worker): at 10 M
# rows the level figures' and the spikes' joins and windows did not fit 128 MB.
RETRY_LIMITS = ("512MB", "2GB")
# The values a batch of `PerGroup` groups may hold: an exact percentile keeps every value of its group
# outside the pool (10 M rows' medians by slice: ~100 MB over it at once, ~25 MB a million at a time).
BATCH_VALUES = 1_000_000


@cache
def extension_path() -> Path:
    """The sqlite extension of the installed wheel, under the name DuckDB loads it by."""
    import duckdb  # here, not at the top: a command that computes nothing starts without it

    spec = importlib.util.find_spec("duckdb_extension_sqlite")
    if spec is None or spec.origin is None:
        raise EvalkitError("duckdb-extension-sqlite is not installed (pip install duckdb-extension-sqlite=="
                           f"{duckdb.__version__})")
    src = Path(spec.origin).parent / "extensions" / f"v{duckdb.__version__}" / "sqlite.duckdb_extension"
    if not src.is_file():
        raise EvalkitError(f"duckdb-extension-sqlite has no build for duckdb {duckdb.__version__} ({src}): "
                           "install the same version of both")
    top = Path(tempfile.gettempdir()) / f"evalkit-duckdb-{os.getuid()}"
    top.mkdir(mode=0o700, exist_ok=True)
    if top.stat().st_uid != os.getuid():  # another user's folder could point the link at their code
        raise EvalkitError(f"{top} belongs to another user: remove it")
    home = top / f"v{duckdb.__version__}"
    dst = home / EXTENSION
    if not dst.is_symlink() or dst.resolve() != src.resolve():
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / f".{EXTENSION}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(src.resolve())
        os.replace(tmp, dst)  # made beside and renamed: a reader never sees half of it
    return dst


def file_id(path: str | Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_PARAM = re.compile(r"\$([A-Za-z_]\w*)")


def literal(value: Any) -> str:
    """A value as a DuckDB literal (a string quoted, its quotes doubled: no escapes in SQL strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"'{value}'::double"
        text = repr(value)  # with an exponent DuckDB reads a double (without, a decimal, then rounded again)
        return text if "e" in text else text + "e0"
    return "'" + str(value).replace("'", "''") + "'"


def newest_grades(graders: list[str], alias: str = "g") -> str:
    """The condition that keeps, of ``alias``'s rows of ``l.grades``, each request's newest grade
    without an error by each of ``graders``: the view `grade_latest`'s rows, by an anti-join on the
    few grades a newer one replaced (`views.SUPERSEDED`, a table of the columnar copy), where
    picking each (request, grader)'s highest id grouped every grade (25 M at 10 M requests)."""
    names = ", ".join(literal(g) for g in graders)
    return (f"{alias}.error_class is null and {alias}.grader in ({names}) "
            f"and {alias}.id not in (select id from l.grade_superseded)")


def bind(sql: str, params: dict[str, Any]) -> str:
    """``sql`` with each ``$name`` replaced by its literal. Prepared parameters would do, but DuckDB
    1.5's sqlite scanner then reads every column of the table: 75 MB more at 100k rows (filters
    on literals are pushed into SQLite's scan)."""
    return _PARAM.sub(lambda m: literal(params[m.group(1)]), sql)


@dataclass(frozen=True)
class PerGroup:
    """A statement run a batch of groups at a time: ``sql`` reads ``{batch}``, a condition on
    ``keys`` (columns of ``table``) that keeps one batch's groups, of at most ``most`` rows each
    (a group past it is a batch alone). Its rows are each batch's in turn; with ``into``, the
    first batch creates that temp table and the others add to it. What all groups hold at once is
    one batch's: a percentile's values, which DuckDB keeps outside its memory limit. One batch (the
    statement as written, ``{batch}`` true) when every row fits in one."""

    sql: str
    table: str
    keys: tuple[str, ...]
    into: str | None = None
    most: int = field(default_factory=lambda: BATCH_VALUES)  # read as it is made (a test sets a small one)
    # past this many groups, one batch: a condition naming thousands of groups is tested on every row
    # (`--by case_id` at 10 M rows), and groups that many are small ones
    max_groups: int = 256

    def batches(self, duck: Duck, params: dict[str, Any]) -> list[str]:
        keys = ", ".join(self.keys)
        _, counts = duck.columns(f"select {keys}, count(*) from {self.table} group by all order by all", params)
        if sum(c[-1] for c in counts) <= self.most or len(counts) > self.max_groups:
            return ["true"]
        out: list[list[tuple[Any, ...]]] = [[]]
        held = 0
        for *key, n in counts:
            if out[-1] and held + n > self.most:
                out.append([])
                held = 0
            out[-1].append(tuple(key))
            held += n
        return [" or ".join("(" + " and ".join(f"{k} is not distinct from {literal(v)}" for k, v in
                                               zip(self.keys, group, strict=True)) + ")" for group in batch)
                for batch in out]

    def run(self, duck: Duck, params: dict[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        names: list[str] = []
        rows: list[tuple[Any, ...]] = []
        for i, batch in enumerate(self.batches(duck, params)):
            sql = self.sql.replace("{batch}", f"({batch})")
            if self.into is not None:
                sql = f"create temp table {self.into} as {sql}" if i == 0 else f"insert into {self.into} {sql}"
            names, got = duck.columns(sql, params)
            rows += got
        return names, rows


class Duck:
    """One in-memory DuckDB with a ledger attached read-only as ``l``: the ledger's tables and its
    views (`measured`, `grade_latest`) are ``l.name``. Close it (or use it in a ``with``)."""

    def __init__(self, path: str | Path, memory_limit: str = MEMORY_LIMIT) -> None:
        import duckdb

        # one thread: a mean summed by two threads in whichever order they finish differs in its last
        # bits from run to run, and the same ledger must give the same report byte for byte; no
        # progress bar: DuckDB draws one on stdout for a query over 2 s, into `report --json`
        self.con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                                      "autoload_known_extensions": False, "threads": 1})
        # what DuckDB spills (hash joins, sorts) goes to a folder of its own, never the user's
        # working directory (an in-memory database's default); gone when the connection closes
        self.spill = tempfile.mkdtemp(prefix="evalkit-duckdb-spill-")
        self.key: tuple[int, int, int, int] | None = None  # the ledger's state the connection was made for
        self.file = file_id(path)  # before the ledger is attached: a file renamed over it after differs
        try:
            self.con.execute(f"set temp_directory = {literal(self.spill)}")
            self.con.execute(f"set memory_limit = {literal(memory_limit)}")
            self.memory_limit = memory_limit
            self.con.execute("set enable_progress_bar = false")  # a session option, not a connect one
            # a join builds its hash table on the side the query names second (runs, cases, a
            # variant's first level): on the columnar copy DuckDB's estimates put the million
            # measured rows there instead, and the build ran out of memory (`columnar`)
            self.con.execute("set disabled_optimizers = 'build_side_probe_side'")
            self.con.execute(f"LOAD '{extension_path()}'")
            self.copied = self._attach(path, memory_limit)
        except BaseException:
            self.close()
            raise

    def _attach(self, path: str | Path, memory_limit: str) -> bool:
        """Attach the ledger and, where one is or can be made, its columnar copy (`columnar`);
        True when the copied tables are read from the copy."""
        from . import columnar
        from .views import SUPERSEDED

        self.con.execute(f"ATTACH {literal(str(path))} AS s (TYPE sqlite, READ_ONLY)")  # ATTACH takes no parameter
        key = self.key = columnar.ledger_key(self.con)
        fresh = key is not None and columnar.attach_fresh(self.con, path, key, memory_limit, extension_path())
        copied = {*columnar.COPIED, *columnar.COPY_VIEWS} if fresh else set()
        names = [n for (n,) in self.con.execute("select table_name from information_schema.tables "
                                                "where table_catalog = 's'").fetchall()]
        self.con.execute("create schema l")
        for name in names:
            self.con.execute(f'create view l."{name}" as select * from {"c" if name in copied else "s"}."{name}"')
        superseded = "select * from c.grade_superseded" if fresh else SUPERSEDED.format(
            grades="l.grades", new="", least=1)
        self.con.execute(f"create view l.grade_superseded as {superseded}")
        return fresh

    def still_fresh(self, path: str | Path) -> bool:
        """Whether the ledger is still the file and the state this connection was made for (its
        columnar copy then still holds its rows; the other tables are read live): what lets the
        query worker keep it for the next query."""
        from . import columnar

        try:
            return self.key is not None and file_id(path) == self.file and columnar.ledger_key(self.con) == self.key
        except Exception:  # noqa: BLE001  (a ledger gone or damaged: a new connection says what)
            return False

    def clear(self) -> bool:
        """Drop what the queries made (temp views, then temp tables); False where one would not go."""
        try:
            for kind, names in (("view", "select view_name from duckdb_views() where temporary and not internal"),
                                ("table", "select table_name from duckdb_tables() where temporary")):
                for (name,) in self.con.execute(names).fetchall():
                    self.con.execute(f'drop {kind} if exists temp."{name}"')
            # the pool's cached blocks go too: kept, they sat under the next query's own (10 M rows: +8 MB peak)
            self.con.execute("set memory_limit = '1MB'")
            self.con.execute(f"set memory_limit = {literal(self.memory_limit)}")
        except Exception:  # noqa: BLE001  (not kept: the next query gets a new connection)
            return False
        return True

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self.columns(sql, params)[1]

    def columns(self, sql: str | PerGroup, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        """(column names, rows) of ``sql``, its ``$name``s replaced by ``params``' values as literals
        (none of either for a statement that returns no rows, e.g. one that makes a temp table);
        a `PerGroup` a batch of groups at a time."""
        if isinstance(sql, PerGroup):
            return sql.run(self, params or {})
        cur = self.con.execute(bind(sql, params or {}))
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()

    def cursor(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """``sql``'s result, to be fetched a part at a time (`QueryWorker.stream`)."""
        return self.con.execute(bind(sql, params or {}))

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.spill, ignore_errors=True)

    def __enter__(self) -> Duck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
