from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from evalkit.errors import LedgerError
from evalkit.ledger import open_ledger
from evalkit.ledger import MIGRATION_NAMES, migrations


def test_blank_db_migrates_to_current_columns(tmp_path: Path):
    db = open_ledger(tmp_path / "l.db").db
    assert set(db.table_names()) >= {"runs", "variants", "cases", "requests", "grades", "_sqlite_migrations"}
    req = set(db["requests"].columns_dict)
    assert req >= {"run_id", "variant", "case_id", "repeat", "is_warmup", "started_at", "ttft_ms", "e2e_ms",
                   "itl_mean_ms", "tpot_ms", "prompt_tokens", "completion_tokens", "finish_reason", "text",
                   "chunk_offsets_ms_json", "error_class", "error", "http_status"}
    assert set(db["grades"].columns_dict) >= {"request_id", "grader", "grader_version", "value", "passed",
                                              "explanation", "detail_json"}
    assert set(db["variants"].columns_dict) >= {"server_args_json", "engine_version", "endpoint_url", "log_tail"}
    assert set(db["runs"].columns_dict) >= {"matrix_json", "dataset_hash", "evalkit_version", "host"}
    assert db.execute("pragma journal_mode").fetchone()[0] == "wal"
    applied = [m.name for m in migrations.applied(db)]
    assert applied == MIGRATION_NAMES
    # opening again applies nothing new and keeps data
    db["runs"].insert({"id": "r1"})
    db2 = open_ledger(tmp_path / "l.db").db
    assert db2["runs"].count == 1


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
    q.write_text("hello, this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="not a SQLite database"):
        open_ledger(q)


def test_newer_schema_is_refused(tmp_path: Path):
    p = tmp_path / "l.db"
    db = open_ledger(p).db
    db["_sqlite_migrations"].insert({"migration_set": "evalkit", "name": "m999_future", "applied_at": "x"})
    with pytest.raises(LedgerError, match="newer evalkit"):
        open_ledger(p)


def test_missing_ledger_when_not_creating(tmp_path: Path):
    with pytest.raises(LedgerError, match="ledger not found"):
        open_ledger(tmp_path / "nope.db", create=False)
