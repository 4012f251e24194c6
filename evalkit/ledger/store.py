"""The SQLite ledger: the only code in evalkit that talks to SQLite (as sqlite-utils' `db.py` is
for its CLI). Everything else calls these methods and holds no SQL.

Write side: runs, variants, requests, server samples, load samples (env.py), grades, derived tables.
Read side: `require_run`, `baseline`, one `measured_requests` join, latest grades, done keys for
resume, the saturation rows, the series behind the plots, the tables that get published.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from ..errors import LedgerWriteError, UsageError
from .aggregate import ReportReads
from .analysis import AnalysisReads
from .case_reads import CaseReads
from .chart_reads import ChartReads
from .derived import DerivedTables
from .done import DoneKeys
from .env import EnvSamples
from .level_reads import LevelReads
from .migrations import migrations
from .register import is_open, track, untrack
from .reviews import ReviewsMixin
from .series import SeriesReads
from .token_scores import TokenScoresMixin
from .verdict_reads import VerdictReads
from .writes import _write, utcnow


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


# Case fields carried by every measured request (what slices, graders and reports need).
CASE_FIELDS = ("task", "persona", "persona_title", "persona_description", "candidate", "complexity", "formality",
               "schema_name", "context_keys_json", "messages_json", "attributes_json", "reference", "schema_json")
# What a report never reads: the texts. A lean read leaves them out (a million rows' worth is gigabytes).
HEAVY_FIELDS = frozenset({"text", "request_json", "chunk_offsets_ms_json", "persona_description", "messages_json",
                          "reference", "schema_json", "context_keys_json", "reasoning_text"})
# Request columns no report, finding, card or derived table reads: a lean read leaves them out too
# (each is ~50 bytes a row in Python; a million rows hold the report's memory and time).
UNREPORTED = frozenset({"n_chunks", "http_status", "n_malformed", "srv_inference_ms", "srv_e2e_ms",
                        "srv_kv_cache_usage_start", "srv_prompt_tokens", "srv_prefix_cache_hits",
                        "srv_resp_generation_ms", "srv_resp_mean_itl_ms", "srv_resp_tokens_per_s", "srv_hist_ttft_ms",
                        "srv_hist_queue_ms", "n_reads", "first_read_chunks", "max_read_chunks", "client_proc",
                        "persona_title", "usage_source", "is_warmup", "final", "attempt", "started_at", "turn"})

# What `publish` exports per run: config name -> (table, how rows belong to the run).
EXPORTS = {
    "requests": "select * from requests where run_id = ?",
    "grades": "select * from grades where run_id = ?",
    "server_samples": "select * from server_samples where run_id = ?",
    "variants": "select * from variants where run_id = ?",
    # the run's cases, not the warm-ups' (they share no prompt with a case and are never measured)
    "cases": "select c.* from cases c join runs u on u.dataset_hash = c.dataset_hash where u.id = ? "
             "and c.id not like '\\_warmup-%' escape '\\'",
    "runs": "select * from runs where id = ?",
    "hosts": "select h.* from hosts h join runs u on u.host_id = h.id where u.id = ?",
    "token_scores": "select * from token_scores where run_id = ?",
    "reviews": "select * from reviews where run_id = ?",
    "env_samples": "select * from env_samples where run_id = ?",  # the machine's load beside the run
    "switches": "select * from switches where run_id = ?",
}


def write_methods() -> list[str]:
    """Every Ledger method that writes: what a Ray worker's ledger forwards to the driver."""
    return sorted(n for n in dir(Ledger) if getattr(getattr(Ledger, n), "ledger_write", False))


class RunRecord(dict):
    """A run's row with its stored JSON parsed once: the matrix, the load, its case ids and trace.
    Still a mapping of the row's columns, so `run["status"]` reads as before."""

    @property
    def matrix(self) -> dict[str, Any]:
        return self.setdefault("_matrix", json.loads(self.get("matrix_json") or "{}"))

    @property
    def load(self) -> dict[str, Any]:
        return self.setdefault("_load", json.loads(self.get("load_json") or "{}"))

    @property
    def case_ids(self) -> list[str]:
        return json.loads(self.get("case_ids_json") or "[]")

    @property
    def trace(self) -> dict[str, Any] | None:
        return json.loads(self["trace_json"]) if self.get("trace_json") else None

    @property
    def repeats(self) -> int:
        """The run's repeats: a baseline's passes past them are drift's noise floor. A search's probes
        cycle the cases (`load.sized_cases`), so there every pass is a case's, none a noise floor."""
        if self.load.get("kind") == "search":
            return 1 << 30
        return int(self.load.get("repeats") or 1)

    @property
    def margins(self) -> dict[str, Any]:
        return self.matrix.get("margins") or {}


class Ledger(SeriesReads, TokenScoresMixin, DerivedTables, ReviewsMixin, ReportReads, AnalysisReads,  # their own modules
             LevelReads, CaseReads, VerdictReads, EnvSamples, ChartReads):
    """One ledger file, migrated. Its sqlite-utils connection is private: every read and write the
    rest of evalkit needs is a method here."""

    def __init__(self, db: Database, path: Path) -> None:
        self._db = db
        self.path = path
        track(self, str(path))

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- runs ---------------------------------------------------------------------------------

    @_write
    def create_run(self, row: dict[str, Any]) -> None:
        self._db["runs"].insert(row)

    @_write
    def update_run(self, run_id: str, fields: dict[str, Any]) -> None:
        self._db["runs"].update(run_id, fields)

    def has_run(self, run_id: str) -> bool:
        return bool(self._db["runs"].count_where("id = ?", [run_id]))

    def require_run(self, run_id: str | None = None, what: str = "") -> RunRecord:
        """The run (the latest when ``run_id`` is None) with its stored JSON parsed; a usage error
        if there is none."""
        run_id = run_id or self.latest_run_id()
        if not self.has_run(run_id):
            raise UsageError(f"{what}no run '{run_id}' in the ledger")
        return RunRecord(self._db["runs"].get(run_id))

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
    def record_switch(self, row: dict[str, Any]) -> None:
        """One switch of `--order blocks`: a variant's server started or woken for a block, and its time."""
        self._db["switches"].insert(row)

    def switches(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._db.query("select * from switches where run_id = ? order by id", [run_id]))

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
    def insert_requests(self, rows: list[dict[str, Any]]) -> None:
        """A batch of request rows in one transaction (the sender writes what settled every few
        hundred milliseconds). Columns are the union of the rows' keys; a row without one gets null."""
        if not rows:
            return
        cols = sorted({k for r in rows for k in r})
        sql = (f"insert into requests ({', '.join(f'[{c}]' for c in cols)}) "
               f"values ({', '.join('?' for _ in cols)})")
        with self._db.conn:
            self._db.conn.executemany(sql, [tuple(r.get(c) for c in cols) for r in rows])

    @_write
    def update_request(self, request_id: int, fields: dict[str, Any]) -> None:
        self._db["requests"].update(request_id, fields)

    def request(self, request_id: int) -> dict[str, Any]:
        return dict(self._db["requests"].get(request_id))

    def turn_texts(self, run_id: str, variant: str, conversation_id: str, repeat: int, level: str) -> dict[int, str]:
        """The replies a conversation already has in the ledger (final, successful): turn -> text."""
        return {r["turn"]: r["text"] or "" for r in self._db.query(
            "select turn, text from requests where run_id = ? and variant = ? and conversation_id = ? and repeat = ? "
            "and coalesce(level, 'main') = ? and final = 1 and error_class is null", [run_id, variant, conversation_id,
                                                                                     repeat, level])}

    def max_mono_ms(self, run_id: str) -> float:
        """The latest end of a request of the run on its clock (0 when none): a resumed run's clock
        goes on from there."""
        return float(self._db.execute("select coalesce(max(mono_start_ms + coalesce(e2e_ms, 0)), 0) from requests "
                                      "where run_id = ?", [run_id]).fetchone()[0])

    def max_seq(self, run_id: str) -> int:
        return int(self._db.execute("select coalesce(max(seq), 0) from requests where run_id = ?", [run_id]).fetchone()[0])

    def done_keys(self, run_id: str) -> DoneKeys:
        """(variant, case, repeat, level) already measured in a run: a resume skips exactly these,
        each looked up in SQL when asked (ledger/done.py), never all held at once."""
        return DoneKeys(self._db, run_id)

    def measured_requests(self, run_id: str, *, ok_only: bool = False, level: str | None = None,
                          variant: str | None = None, lean: bool = False) -> list[dict[str, Any]]:
        """Measured requests (not warm-ups, final attempts) of a run, each with its case's fields,
        in send order. The one requests ⋈ cases join. ``lean``: without the texts (`HEAVY_FIELDS`) and
        the columns no report reads (`UNREPORTED`)."""
        return list(self.iter_measured(run_id, ok_only=ok_only, level=level, variant=variant, lean=lean))

    def iter_measured(self, run_id: str, *, ok_only: bool = False, level: str | None = None,
                      variant: str | None = None, lean: bool = False, with_cases: bool = True
                      ) -> Iterator[dict[str, Any]]:
        """`measured_requests` one row at a time (a pass over a million rows holds one).
        ``with_cases=False``: the request's own columns only, of rows whose case is in the ledger
        (the caller attaches `case_fields`: a million rows then share a few hundred case values)."""
        where = ["r.run_id = ?"]  # of the `measured` view
        params: list[Any] = [run_id]
        if ok_only:
            where.append("r.ok")
        if level is not None:
            where.append("r.level = ?")
            params.append(level)
        if variant is not None:
            where.append("r.variant = ?")
            params.append(variant)
        cols = ", ".join(f"c.{f}" for f in CASE_FIELDS if not (lean and f in HEAVY_FIELDS | UNREPORTED)) \
            if with_cases else "1 as _case"
        mine = ", ".join(f"r.[{c}]" for c in self._db["requests"].columns_dict  # the request's own columns
                         if not (lean and c in HEAVY_FIELDS | UNREPORTED))
        return self._db.query(
            f"""select {mine}, {cols} from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where {' and '.join(where)} order by r.seq, r.id""", params)

    def case_fields(self, run_id: str, lean: bool = False) -> dict[str, dict[str, Any]]:
        """case id -> its fields (`CASE_FIELDS`; ``lean``: without the texts), for the run's dataset."""
        names = [f for f in CASE_FIELDS if not (lean and f in HEAVY_FIELDS | UNREPORTED)]
        return {r[0]: dict(zip(names, r[1:], strict=True)) for r in self._db.execute(
            f"select c.id, {', '.join(f'c.{f}' for f in names)} from cases c join runs u "
            "on c.dataset_hash = u.dataset_hash where u.id = ?", [run_id])}

    def sample_outputs(self, run_id: str, n_cases: int = 3) -> list[dict[str, Any]]:
        """The first repeat of the first few measured cases, every variant's answer (the HTML
        report shows them verbatim)."""
        return list(self._db.query(
            """select variant, case_id, text, error from measured where run_id = ? and repeat = 0 and case_id in
               (select case_id from measured where run_id = ? group by case_id order by min(seq) limit ?)
               order by seq""", [run_id, run_id, n_cases]))

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
            """select request_id, grader, grader_version, value, passed, explanation, detail_json from grade_latest
               where run_id = ?""",
            [run_id],
        ):
            g["detail"] = json.loads(g.pop("detail_json") or "{}")
            out[g["request_id"]][g["grader"]] = g
        return out

    def grade_errors(self, run_id: str) -> list[dict[str, Any]]:
        """The requests whose grader raised and that no later grade of that grader and version
        replaced: request id, grader, version, the exception's class and message, the case."""
        return list(self._db.query(
            """select g.request_id, g.grader, g.grader_version, g.error_class, g.error, r.case_id, r.variant
               from grades g join requests r on r.id = g.request_id
               where g.run_id = ? and g.error_class is not null and not exists (
                 select 1 from grades h where h.request_id = g.request_id and h.grader = g.grader
                   and h.grader_version = g.grader_version and h.id > g.id)
               order by g.id""", [run_id]))

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
            "select id, variant, case_id, repeat, level, attempt from measured where run_id = ? "
            f"and ({' or '.join(conds) or '0'})", [run_id, *exact, *families]))
        with self._db.conn:
            for r in rows:
                self._db["requests"].update(r["id"], {"final": 0})
        return {(r["variant"], r["case_id"], r["repeat"], r["level"] or "main"): (r["attempt"] or 0) + 1 for r in rows}

    def next_attempts(self, run_id: str) -> dict[tuple[str, str, int, str], int]:
        """Keys with attempts but no final row yet (retried, or interrupted mid-flight): the
        attempt number the next one gets."""
        return {(r["variant"], r["case_id"], r["repeat"], r["level"] or "main"): r["n"] for r in self._db.query(
            "select variant, case_id, repeat, level, max(attempt) + 1 as n from requests where run_id = ? "
            "and is_warmup = 0 group by variant, case_id, repeat, level having max(final) = 0", [run_id])}

    def attempt_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per variant: measured rows (every attempt), final rows, and requests sent more than once."""
        return {v: {"attempts": n, "final": final, "sent_again": again} for v, n, final, again in self.query(
            "select variant, count(*), sum(final), count(distinct case when attempt > 0 then case_id || '#' || "
            "cast(repeat as varchar) || '#' || level end) from l.requests where run_id = $run and is_warmup = 0 "
            "group by variant order by variant", {"run": run_id})[1]}

    def final_error_rate(self, run_id: str, variant: str) -> tuple[int, int]:
        """(failed, all) final measured requests of a variant."""
        r = next(self._db.query("select count(*) as n, sum(not ok) as bad from measured where run_id = ? and "
                                "variant = ?", [run_id, variant]))
        return int(r["bad"] or 0), int(r["n"] or 0)

    def migrations_applied(self) -> list[str]:
        return [m.name for m in migrations.applied(self._db)]

    def close(self) -> None:
        """Close the connection (idempotent). Every command closes what it opened: a connection left
        to the garbage collector holds its locks and its `-wal` open for as long as it lives."""
        untrack(self)
        self.close_worker()
        self._db.conn.close()

    @property
    def closed(self) -> bool:
        return not is_open(self)
