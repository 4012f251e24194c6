from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.errors import LedgerError
from evalkit.ledger import MIGRATION_NAMES, copy_ledger, migrations, open_ledger
from evalkit.paths import default_dataset_path
from evalkit.testing.stub_server import StubConfig, StubServer

from .ledger_integrity import not_a_ledger

# Written by evalkit before the ledger package (migrations m001-m004): one complete run of 3 cases
# with grades, and one run of 2 cases marked interrupted with its last 2 measured requests missing.
LEGACY = Path(__file__).parent / "fixtures" / "ledger_m004.db"


def test_blank_db_migrates_to_current_columns(tmp_path: Path):
    open_ledger(tmp_path / "l.db").close()
    db = Database(tmp_path / "l.db")
    assert set(db.table_names()) >= {"runs", "variants", "cases", "requests", "grades", "_sqlite_migrations"}
    req = set(db["requests"].columns_dict)
    assert req >= {"run_id", "variant", "case_id", "repeat", "is_warmup", "started_at", "ttft_ms", "e2e_ms",
                   "itl_mean_ms", "tpot_ms", "prompt_tokens", "completion_tokens", "finish_reason", "text",
                   "chunk_offsets_ms_json", "error_class", "error", "http_status"}
    assert set(db["grades"].columns_dict) >= {"request_id", "grader", "grader_version", "value", "passed",
                                              "explanation", "detail_json"}
    assert set(db["variants"].columns_dict) >= {"server_args_json", "engine_version", "endpoint_url", "log_tail"}
    assert set(db["runs"].columns_dict) >= {"matrix_json", "dataset_hash", "evalkit_version", "host", "host_id"}
    assert set(db["hosts"].columns_dict) >= {"cpu_model", "cores", "memory_gib", "isa_json", "cpu_class", "gpu_json",
                                             "torch_version", "vllm_version", "evalkit_version", "os"}
    assert req >= {"replica", "scheduled_ms", "sent_ms", "client_wait_ms", "ttft_from_schedule_ms"}
    assert set(db["variants"].columns_dict) >= {"dtype", "dtype_reason", "cost_json"}
    view = set(db["requests_joined"].columns_dict)
    assert view >= {"schema_passed", "persona_score", "formality_predicted", "drift_cosine", "ttft_from_schedule_ms"}
    # the /metrics time series is server_samples (the 0.1 name's view went with 0.3)
    assert "server_samples" in db.table_names()
    assert "server_metrics" not in db.view_names()
    assert "level" in req  # a load level (was `phase`, which also meant the server's queue/prefill/decode)
    assert set(db["server_samples"].columns_dict) >= {"run_id", "variant", "replica", "mono_ms", "series", "value"}
    assert db.execute("pragma journal_mode").fetchone()[0] == "wal"
    applied = [m.name for m in migrations.applied(db)]
    assert applied == MIGRATION_NAMES
    # opening again applies nothing new and keeps data
    db["runs"].insert({"id": "r1"})
    open_ledger(tmp_path / "l.db").close()
    assert Database(tmp_path / "l.db")["runs"].count == 1


def test_migration_names_are_unique_and_numbered():
    names = list(MIGRATION_NAMES)
    assert len(names) == len(set(names))
    assert all(n[0] == "m" and n[1:4].isdigit() for n in names)
    assert names == sorted(names)


def test_not_an_evalkit_ledger(tmp_path: Path):
    p = tmp_path / "other.db"
    sqlite3.connect(p).execute("create table t (x)")
    with pytest.raises(LedgerError, match="not an evalkit ledger"):
        open_ledger(p)
    q = tmp_path / "text.db"
    not_a_ledger(q).write_text("hello, this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="not a SQLite database"):
        open_ledger(q)


def test_newer_schema_is_refused(tmp_path: Path):
    p = tmp_path / "l.db"
    open_ledger(p).close()
    Database(p)["_sqlite_migrations"].insert({"migration_set": "evalkit", "name": "m999_future", "applied_at": "x"})
    with pytest.raises(LedgerError, match="newer evalkit"):
        open_ledger(p)


def test_missing_ledger_when_not_creating(tmp_path: Path):
    with pytest.raises(LedgerError, match="ledger not found"):
        open_ledger(tmp_path / "nope.db", create=False)


@pytest.mark.integration
def test_ledger_from_before_the_ledger_package_opens_reports_and_resumes(tmp_path: Path, runner):
    p = tmp_path / "old.db"
    copy_ledger(LEGACY, p)
    ledger = open_ledger(p)
    assert [m.name for m in migrations.applied(Database(p))] == MIGRATION_NAMES  # m005+ applied on open
    old_run, cut_run = ledger.run_ids()
    assert ledger.require_run(old_run)["host_id"] is None  # hosts were not recorded then

    r = runner.invoke(cli, ["report", "--json", "--run", old_run, "--ledger", str(p)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    base = next(x for x in rep["rows"] if x["variant"] == "base" and x["complexity"] == "all")
    assert base["n"] == 3  # 3 cases: the baseline's noise-floor pass is drift's floor, not cases
    assert base["schema_pass_pct"] == 100.0
    assert rep["host"] is None
    assert {"schema", "persona", "formality", "drift"} <= set(rep["graders"])
    assert "host: not recorded" in runner.invoke(cli, ["report", "--run", old_run, "--ledger", str(p)]).output

    # resume the cut run against live stubs (its stored endpoints are long gone) and the shipped data
    before = len(ledger.done_keys(cut_run))  # asked of the ledger now, before the resume
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=25, itl_ms=1)) as b:
        m = json.loads(ledger.require_run(cut_run)["matrix_json"])
        for v, s in zip(m["variants"], (a, b), strict=True):
            v["endpoint"] = s.base_url
        ledger.update_run(cut_run, {"matrix_json": json.dumps(m), "dataset_path": str(default_dataset_path())})
        r = runner.invoke(cli, ["run", "--resume", cut_run, "--ledger", str(p), "-q"])
    assert r.exit_code == 0, r.output
    assert "2 already" not in r.output
    assert "skipped" in r.output
    after = len(ledger.done_keys(cut_run))
    assert after == before + 2  # exactly the two missing requests
    finals = ledger.measured_requests(cut_run)
    keys = [(x["variant"], x["case_id"], x["repeat"], x["level"]) for x in finals]
    assert len(keys) == len(set(keys))  # no duplicates


# --- `measured` and `grade_latest`: what is measured, defined once (issue 48) ----------------------


@pytest.fixture
def viewed(tmp_path: Path):
    """Three requests of run r: a warm-up, a retried attempt (final 0) and its final retry, a
    failure, a success at concurrency 4; grades re-graded, one grading that raised last."""
    path = tmp_path / "v.db"
    open_ledger(path).close()
    db = Database(path)
    base = {"run_id": "r", "variant": "a", "repeat": 0, "final": 1, "is_warmup": 0, "concurrency": None}
    db["requests"].insert_all([
        {**base, "id": 1, "case_id": "w", "is_warmup": 1, "seq": 1},
        {**base, "id": 2, "case_id": "c1", "final": 0, "error_class": "timeout", "seq": 2},
        {**base, "id": 3, "case_id": "c1", "seq": 3},
        {**base, "id": 4, "case_id": "c2", "error_class": "http_500", "seq": 4},
        {**base, "id": 5, "case_id": "c3", "concurrency": 4, "seq": 5},
    ])
    g = {"run_id": "r", "grader": "schema", "grader_version": "1"}
    db["grades"].insert_all([
        {**g, "id": 1, "request_id": 3, "value": 0.0},
        {**g, "id": 2, "request_id": 3, "value": 1.0},
        {**g, "id": 3, "request_id": 3, "value": None, "error_class": "ValueError"},
        {**g, "id": 4, "request_id": 5, "value": 0.5},
    ])
    yield db
    db.close()


def test_measured_holds_the_final_requests_that_are_not_warm_ups(viewed):
    assert [r[0] for r in viewed.execute("select id from measured order by id")] == [3, 4, 5]


def test_measured_says_which_requests_succeeded(viewed):
    assert dict(viewed.execute("select id, ok from measured").fetchall()) == {3: 1, 4: 0, 5: 1}


def test_measured_counts_no_concurrency_as_level_one(viewed):
    assert dict(viewed.execute("select id, load_level from measured").fetchall()) == {3: 1, 4: 1, 5: 4}


def test_grade_latest_keeps_the_newest_grade_without_an_error(viewed):
    assert viewed.execute("select request_id, value from grade_latest order by request_id").fetchall() == \
        [(3, 1.0), (5, 0.5)]


def test_measured_has_every_request_column(viewed):
    assert set(viewed["requests"].columns_dict) <= set(viewed["measured"].columns_dict)


def test_measured_e2e_adds_the_measured_requests_up(viewed):
    viewed.execute("update requests set e2e_ms = id * 100.0")  # the warm-up (1) and the retried attempt (2) not
    viewed.conn.commit()
    with open_ledger(viewed.conn.execute("pragma database_list").fetchone()[2]) as led:
        assert led.measured_e2e("r") == (1200.0, 3)
