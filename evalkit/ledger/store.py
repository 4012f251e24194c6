"""The SQLite ledger: the only code in evalkit that talks to SQLite (as sqlite-utils' `db.py` is
for its CLI). Everything else calls these methods and holds no SQL.

Write side: runs, variants, requests, server samples, grades, derived tables.
Read side: `require_run`, `baseline`, one `measured_requests` join, latest grades, done keys for
resume, the saturation rows, the series behind the plots, the tables that get published.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from ..errors import LedgerError, LedgerWriteError, UsageError
from .migrations import MIGRATION_NAMES, MIGRATION_SET, migrations, requests_view_sql
from .token_scores import TokenScoresMixin


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


# Case fields carried by every measured request (what slices, graders and reports need).
CASE_FIELDS = ("task", "persona", "persona_title", "persona_description", "candidate", "complexity", "formality",
               "schema_name", "context_keys_json", "messages_json")

# What `publish` exports per run: config name -> (table, how rows belong to the run).
EXPORTS = {
    "requests": "select * from requests where run_id = ?",
    "grades": "select * from grades where run_id = ?",
    "server_samples": "select * from server_samples where run_id = ?",
    "variants": "select * from variants where run_id = ?",
    "cases": "select c.* from cases c join runs u on u.dataset_hash = c.dataset_hash where u.id = ?",
    "runs": "select * from runs where id = ?",
    "hosts": "select h.* from hosts h join runs u on u.host_id = h.id where u.id = ?",
    "token_scores": "select * from token_scores where run_id = ?",
}


F = TypeVar("F", bound=Callable[..., Any])


def _write(fn: F) -> F:
    """A ledger write that fails (a full disk, a read-only file, a lock held too long) becomes one
    LedgerWriteError naming the ledger, never a traceback through the runner."""
    @functools.wraps(fn)
    def wrapped(self: Ledger, *a: Any, **kw: Any) -> Any:
        try:
            return fn(self, *a, **kw)
        except sqlite3.OperationalError as e:
            raise LedgerWriteError(f"{self.path}: cannot write the ledger ({e})") from None

    return wrapped  # type: ignore[return-value]


class Ledger(TokenScoresMixin):  # teacher-forced scores: ledger/token_scores.py
    """One ledger file, migrated. Its sqlite-utils connection is private: every read and write the
    rest of evalkit needs is a method here."""

    def __init__(self, db: Database, path: Path) -> None:
        self._db = db
        self.path = path

    # --- runs ---------------------------------------------------------------------------------

    @_write
    def create_run(self, row: dict[str, Any]) -> None:
        self._db["runs"].insert(row)

    @_write
    def update_run(self, run_id: str, fields: dict[str, Any]) -> None:
        self._db["runs"].update(run_id, fields)

    def has_run(self, run_id: str) -> bool:
        return bool(self._db["runs"].count_where("id = ?", [run_id]))

    def require_run(self, run_id: str | None = None, what: str = "") -> dict[str, Any]:
        """The run's row (the latest run when ``run_id`` is None); a usage error if there is none."""
        run_id = run_id or self.latest_run_id()
        if not self.has_run(run_id):
            raise UsageError(f"{what}no run '{run_id}' in the ledger")
        return dict(self._db["runs"].get(run_id))

    def latest_run_id(self) -> str:
        row = next(self._db.query("select id from runs order by created_at desc, rowid desc limit 1"), None)
        if row is None:
            raise UsageError("the ledger has no runs yet: run `evalkit run` first")
        return row["id"]

    def run_ids(self, matrix_name: str | None = None) -> list[str]:
        if matrix_name is None:
            return [r["id"] for r in self._db.query("select id from runs order by created_at, rowid")]
        return [r["id"] for r in self._db.query("select id from runs where matrix_name = ? order by created_at, rowid",
                                               [matrix_name])]

    def run_hosts(self, matrix_name: str) -> list[dict[str, Any] | None]:
        """The host of every run of one matrix (None for runs recorded before hosts were)."""
        return [self.host(r["host_id"]) for r in self._db.query(
            "select host_id from runs where matrix_name = ? order by created_at, rowid", [matrix_name])]

    # --- hosts ----------------------------------------------------------------------------------

    @_write
    def record_host(self, host: dict[str, Any]) -> str:
        """Store a host description once (keyed by its content hash) and return its id."""
        self._db["hosts"].upsert(host, pk="id")
        return host["id"]

    def host(self, host_id: str | None) -> dict[str, Any] | None:
        if not host_id or not self._db["hosts"].count_where("id = ?", [host_id]):
            return None
        return dict(self._db["hosts"].get(host_id))

    # --- cases, variants ------------------------------------------------------------------------

    @_write
    def record_cases(self, rows: list[dict[str, Any]]) -> None:
        self._db["cases"].upsert_all(rows, pk=("dataset_hash", "id"))

    @_write
    def upsert_variant(self, row: dict[str, Any]) -> None:
        self._db["variants"].upsert(row, pk="id")

    @_write
    def update_variant(self, vid: str, fields: dict[str, Any]) -> None:
        self._db["variants"].update(vid, fields)

    def has_variant(self, vid: str) -> bool:
        return bool(self._db["variants"].count_where("id = ?", [vid]))

    @_write
    def upsert_replica(self, row: dict[str, Any]) -> None:
        self._db["replicas"].upsert(row, pk="id")

    def replicas(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._db.query("select * from replicas where run_id = ? order by variant, replica", [run_id]))

    def variant(self, vid: str) -> dict[str, Any] | None:
        return dict(self._db["variants"].get(vid)) if self.has_variant(vid) else None

    def variants(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._db.query("select * from variants where run_id = ? order by rowid", [run_id]))

    def baseline(self, run_id: str) -> str | None:
        return next((v["name"] for v in self._db.query(
            "select name from variants where run_id = ? and is_baseline = 1", [run_id])), None)

    # --- requests -------------------------------------------------------------------------------

    @_write
    def insert_request(self, row: dict[str, Any]) -> int:
        return int(self._db["requests"].insert(row).last_pk)

    @_write
    def update_request(self, request_id: int, fields: dict[str, Any]) -> None:
        self._db["requests"].update(request_id, fields)

    def request(self, request_id: int) -> dict[str, Any]:
        return dict(self._db["requests"].get(request_id))

    def turn_texts(self, run_id: str, variant: str, conversation_id: str, repeat: int, phase: str) -> dict[int, str]:
        """The replies a conversation already has in the ledger (final, successful): turn -> text."""
        return {r["turn"]: r["text"] or "" for r in self._db.query(
            "select turn, text from requests where run_id = ? and variant = ? and conversation_id = ? and repeat = ? "
            "and coalesce(phase, 'main') = ? and final = 1 and error_class is null", [run_id, variant, conversation_id,
                                                                                     repeat, phase])}

    def max_seq(self, run_id: str) -> int:
        return int(self._db.execute("select coalesce(max(seq), 0) from requests where run_id = ?", [run_id]).fetchone()[0])

    def done_keys(self, run_id: str) -> set[tuple[str, str, int, str]]:
        """(variant, case, repeat, phase) already measured in a run: a resume skips exactly these."""
        return {
            (r["variant"], r["case_id"], r["repeat"], r["phase"] or "main")
            for r in self._db.query("select variant, case_id, repeat, phase from requests "
                                   "where run_id = ? and is_warmup = 0 and final = 1", [run_id])
        }

    def measured_requests(self, run_id: str, *, ok_only: bool = False, phase: str | None = None,
                          variant: str | None = None) -> list[dict[str, Any]]:
        """Measured requests (not warm-ups, final attempts) of a run, each with its case's fields,
        in send order. The one requests ⋈ cases join."""
        where = ["r.run_id = ?", "r.is_warmup = 0", "r.final = 1"]
        params: list[Any] = [run_id]
        if ok_only:
            where.append("r.error_class is null")
        if phase is not None:
            where.append("r.phase = ?")
            params.append(phase)
        if variant is not None:
            where.append("r.variant = ?")
            params.append(variant)
        cols = ", ".join(f"c.{f}" for f in CASE_FIELDS)
        return list(self._db.query(
            f"""select r.*, {cols} from requests r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where {' and '.join(where)} order by r.seq, r.id""", params))

    # --- server samples -------------------------------------------------------------------------

    @_write
    def insert_server_samples(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._db["server_samples"].insert_all(rows)

    def server_series(self, run_id: str, series: str, variant: str | None = None) -> list[dict[str, Any]]:
        """(variant, replica, mono_ms, value) points of one /metrics series, in time order per server
        (values are stored when they change, so a point holds until the next one)."""
        sql = "select variant, replica, mono_ms, value from server_samples where run_id = ? and series = ?"
        params: list[Any] = [run_id, series]
        if variant is not None:
            sql += " and variant = ?"
            params.append(variant)
        return list(self._db.query(sql + " order by variant, replica, mono_ms", params))

    def series_delta(self, run_id: str, variant: str, series: str, start_ms: float | None = None,
                     end_ms: float | None = None, replica: int | None = None, every_replica: bool = True
                     ) -> float | None:
        """How much a server counter grew between two moments on its server's clock (the whole run
        when not given), summed over the variant's servers (each replica's counter is its own
        series: interleaved they would count each other's values as growth). ``replica`` with
        ``every_replica=False``: one server only."""
        by: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for p in self.server_series(run_id, series, variant):
            if every_replica or p["replica"] == replica:
                by[p["replica"]].append(p)
        if not by:
            return None

        def at(pts: list[dict[str, Any]], t: float | None, default: float) -> float:
            if t is None:
                return default
            before = [p["value"] for p in pts if p["mono_ms"] <= t]
            return before[-1] if before else pts[0]["value"]

        return sum(at(pts, end_ms, pts[-1]["value"]) - at(pts, start_ms, pts[0]["value"]) for pts in by.values())

    def level_counter_delta(self, run_id: str, variant: str, rows: list[dict[str, Any]], series: str,
                            until_ms: dict[Any, float] | None = None, margin_ms: float = 1000.0) -> float | None:
        """A server counter's growth over one load level, per server, summed: from the level's first
        send on that server to ``margin_ms`` after its last request ended (the scraper samples just
        after), but never past ``until_ms[replica]``, when the next level began on that server."""
        spans: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            if r["mono_start_ms"] is not None:
                spans[r["replica"]].append((r["mono_start_ms"], r["mono_start_ms"] + (r["e2e_ms"] or 0.0)))
        total, seen = 0.0, False
        for rep, sp in spans.items():
            end = max(b for _, b in sp) + margin_ms
            if until_ms and rep in until_ms:
                end = min(end, until_ms[rep] - 1e-3)
            d = self.series_delta(run_id, variant, series, min(a for a, _ in sp) - 1, end, rep, every_replica=False)
            if d is not None:
                total, seen = total + d, True
        return total if seen else None

    @_write
    def insert_client_lag(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._db["client_lag"].insert_all(rows)

    def client_lag(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._db.query("select proc, phase, mono_ms, lag_ms from client_lag where run_id = ? "
                                   "order by mono_ms", [run_id]))

    # --- grades ---------------------------------------------------------------------------------

    @_write
    def insert_grades(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._db["grades"].insert_all(rows)

    def graded_request_ids(self, run_id: str, grader: str, version: str) -> set[int]:
        return {r["request_id"] for r in self._db.query(
            "select request_id from grades where run_id = ? and grader = ? and grader_version = ?",
            [run_id, grader, version])}

    def latest_grades(self, run_id: str) -> dict[int, dict[str, dict[str, Any]]]:
        """request id -> grader -> its newest grade row (re-grading adds rows; the newest counts)."""
        out: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
        for g in self._db.query(
            """select g.request_id, g.grader, g.grader_version, g.value, g.passed, g.explanation, g.detail_json
               from grades g join (select max(id) as id from grades where run_id = ? group by request_id, grader) m
               on m.id = g.id""",
            [run_id],
        ):
            g["detail"] = json.loads(g.pop("detail_json") or "{}")
            out[g["request_id"]][g["grader"]] = g
        return out

    def grader_names(self, run_id: str | None = None) -> list[str]:
        sql, params = "select distinct grader from grades", []
        if run_id:
            sql, params = sql + " where run_id = ?", [run_id]
        return [r["grader"] for r in self._db.query(sql + " order by grader", params)]

    # --- derived tables and views ---------------------------------------------------------------

    @_write
    def replace_derived(self, spikes: list[dict[str, Any]], summary: list[dict[str, Any]],
                        cost: list[dict[str, Any]] | None = None, verdicts: list[dict[str, Any]] | None = None) -> None:
        """Findings that need Python (robust statistics), recomputed for Datasette in one transaction."""
        with self._db.conn:
            for table, rows in (("derived_spikes", spikes), ("derived_summary", summary), ("derived_cost", cost or []),
                                ("derived_verdicts", verdicts or [])):
                self._db[table].delete_where()
                if rows:
                    self._db[table].insert_all(rows)

    @_write
    def define_requests_view(self, grade_columns: Iterable[tuple[str, str, str]]) -> None:
        """(Re)create `requests_joined` with one column per (column, grader, field) given."""
        with self._db.conn:
            self._db.execute("drop view if exists requests_joined")
            self._db.execute(requests_view_sql(grade_columns))

    # --- export ---------------------------------------------------------------------------------

    def export_tables(self, run_id: str) -> dict[str, list[dict[str, Any]]]:
        self.require_run(run_id)
        return {name: list(self._db.query(sql, [run_id])) for name, sql in EXPORTS.items()}

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group many writes into one commit (the Ray driver applies a worker's batch this way)."""
        try:
            with self._db.conn:
                yield
        except sqlite3.OperationalError as e:
            raise LedgerWriteError(f"{self.path}: cannot write the ledger ({e})") from None

    @_write
    def close_open_variants(self, run_id: str, status: str, cause: str) -> list[str]:
        """Variants of a run still `starting`/`running` when the run ended get ``status`` and the
        cause (a run never leaves a variant `running` behind). Returns their names."""
        rows = list(self._db.query("select id, name from variants where run_id = ? and status in "
                                   "('starting', 'running')", [run_id]))
        for r in rows:
            self._db["variants"].update(r["id"], {"status": status, "error": cause, "stopped_at": utcnow()})
        return [r["name"] for r in rows]

    @_write
    def reopen_failed(self, run_id: str, classes: list[str]) -> dict[tuple[str, str, int, str], int]:
        """For `--retry-failed`: the final rows of a run whose error class is one of ``classes``
        become non-final attempts (kept, never deleted), so a resume sends them again. Returns each
        key's next attempt number."""
        exact = [c for c in classes if not c.endswith("xx")]
        families = [c[:-2] + "%" for c in classes if c.endswith("xx")]  # http_5xx -> http_5%
        conds = ([f"error_class in ({','.join('?' * len(exact))})"] if exact else []) + \
            ["error_class like ?" for _ in families]
        rows = list(self._db.query(
            "select id, variant, case_id, repeat, phase, attempt from requests where run_id = ? and final = 1 "
            f"and is_warmup = 0 and ({' or '.join(conds) or '0'})", [run_id, *exact, *families]))
        with self._db.conn:
            for r in rows:
                self._db["requests"].update(r["id"], {"final": 0})
        return {(r["variant"], r["case_id"], r["repeat"], r["phase"] or "main"): (r["attempt"] or 0) + 1 for r in rows}

    def next_attempts(self, run_id: str) -> dict[tuple[str, str, int, str], int]:
        """Keys with attempts but no final row yet (retried, or interrupted mid-flight): the
        attempt number the next one gets."""
        return {(r["variant"], r["case_id"], r["repeat"], r["phase"] or "main"): r["n"] for r in self._db.query(
            "select variant, case_id, repeat, phase, max(attempt) + 1 as n from requests where run_id = ? "
            "and is_warmup = 0 group by variant, case_id, repeat, phase having max(final) = 0", [run_id])}

    def attempt_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per variant: measured rows (every attempt), final rows, and requests sent more than once."""
        return {r["variant"]: {"attempts": r["attempts"], "final": r["final"], "sent_again": r["again"]}
                for r in self._db.query(
                    "select variant, count(*) as attempts, sum(final) as final, "
                    "count(distinct case when attempt > 0 then case_id || '#' || repeat || '#' || phase end) as again "
                    "from requests where run_id = ? and is_warmup = 0 group by variant", [run_id])}

    def final_error_rate(self, run_id: str, variant: str) -> tuple[int, int]:
        """(failed, all) final measured requests of a variant."""
        r = next(self._db.query("select count(*) as n, sum(error_class is not null) as bad from requests where "
                                "run_id = ? and variant = ? and is_warmup = 0 and final = 1", [run_id, variant]))
        return int(r["bad"] or 0), int(r["n"] or 0)

    def close(self) -> None:
        self._db.conn.close()


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


def open_ledger(path: str | Path, *, create: bool = True) -> Ledger:
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
    return Ledger(db, p)
