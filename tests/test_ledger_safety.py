"""A ledger nothing can corrupt (issue 45): one safe copy, merges that never open the wrong
database nor write their inputs, connections closed, one SQLite library."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from evalkit.cli import cli
from evalkit.errors import LedgerError, LedgerWriteError, UsageError
from evalkit.ledger import copy_ledger, open_ledger, open_ledgers
from evalkit.ledger.merge import merge_ledgers
from evalkit.ledger.opening import applied_migrations, integrity
from evalkit.paths import PACKAGE_DIR, PROJECT_DIR

from .ledger_integrity import expect_rows

LEGACY = Path(__file__).parent / "fixtures" / "ledger_m004.db"
CLI = [sys.executable, str(PROJECT_DIR / "cli.py")]


def small_ledger(path: Path, run_id: str, n: int, *, keep_open: bool = False):
    """A ledger with one run of ``n`` final measured requests (no server needed)."""
    led = open_ledger(path)
    led._db["runs"].insert({"id": run_id, "status": "complete", "created_at": f"2026-12-05T00:00:0{len(run_id) % 10}"},
                           alter=True)
    led.insert_requests([{"run_id": run_id, "variant": "base", "case_id": f"c{i}", "repeat": 0, "level": "main",
                          "final": 1, "is_warmup": 0, "seq": i + 1, "text": f"answer {i}"} for i in range(n)])
    if keep_open:
        return led
    led.close()
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def count(path: Path, table: str = "requests") -> int:
    c = sqlite3.connect(path)
    try:
        return c.execute(f"select count(*) from [{table}]").fetchone()[0]
    finally:
        c.close()


# --- the one safe copy ------------------------------------------------------------------------------


def test_a_copy_of_a_live_ledger_holds_the_rows_still_in_its_wal(tmp_path):
    led = small_ledger(tmp_path / "live.db", "r1", 0, keep_open=True)
    led._db.execute("pragma wal_autocheckpoint=0")  # every row stays in the -wal
    led.insert_requests([{"run_id": "r1", "variant": "base", "case_id": f"c{i}", "repeat": 0, "final": 1,
                          "is_warmup": 0, "seq": i + 1} for i in range(300)])
    try:
        copy_ledger(tmp_path / "live.db", tmp_path / "copy.db")
        assert count(tmp_path / "copy.db") == 300
    finally:
        led.close()


def test_copying_keeps_the_originals_wal_for_its_live_connection(tmp_path):
    led = small_ledger(tmp_path / "live.db", "r1", 5, keep_open=True)
    led._db.execute("pragma wal_autocheckpoint=0")
    try:
        copy_ledger(tmp_path / "live.db", tmp_path / "copy.db")
        led.insert_requests([{"run_id": "r1", "variant": "base", "case_id": "after", "repeat": 0, "final": 1,
                              "is_warmup": 0, "seq": 99}])
        assert Path(f"{tmp_path / 'live.db'}-wal").exists()
    finally:
        led.close()
    assert count(tmp_path / "live.db") == 6


def test_a_copy_is_one_file_in_rollback_mode(tmp_path):
    copy_ledger(small_ledger(tmp_path / "a.db", "r1", 3), tmp_path / "copy.db")
    assert sorted(p.name for p in tmp_path.iterdir() if "copy" in p.name) == ["copy.db"]


def test_a_copy_refuses_an_existing_destination(tmp_path):
    small_ledger(tmp_path / "a.db", "r1", 3)
    small_ledger(tmp_path / "b.db", "r2", 3)
    with pytest.raises(UsageError, match="exists"):
        copy_ledger(tmp_path / "a.db", tmp_path / "b.db")


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_copy_refuses_a_leftover_journal_at_its_destination(tmp_path, suffix):
    small_ledger(tmp_path / "a.db", "r1", 3)
    Path(f"{tmp_path / 'b.db'}{suffix}").write_bytes(b"\0" * 64)
    with pytest.raises(UsageError, match=f"b.db{suffix} is left over"):
        copy_ledger(tmp_path / "a.db", tmp_path / "b.db")


def test_a_copy_of_a_missing_ledger_is_one_line(tmp_path):
    with pytest.raises(LedgerError, match="ledger not found"):
        copy_ledger(tmp_path / "none.db", tmp_path / "b.db")


def test_the_copy_command_copies_through_the_backup_api(tmp_path):
    small_ledger(tmp_path / "a.db", "r1", 4)
    r = CliRunner().invoke(cli, ["ledger", "copy", str(tmp_path / "a.db"), str(tmp_path / "c.db")])
    assert r.exit_code == 0, r.output
    assert count(tmp_path / "c.db") == 4


# --- merge ---------------------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path):
    return small_ledger(tmp_path / "a.db", "r-a", 6), small_ledger(tmp_path / "b.db", "r-b", 12)


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_merge_refuses_a_leftover_journal_at_its_output(inputs, tmp_path, suffix):
    Path(f"{tmp_path / 'out.db'}{suffix}").write_bytes(b"\0" * 64)
    with pytest.raises(UsageError, match=f"out.db{suffix} is left over"):
        merge_ledgers(list(inputs), tmp_path / "out.db")


def test_a_refused_merge_writes_no_output(inputs, tmp_path):
    Path(f"{tmp_path / 'out.db'}-wal").write_bytes(b"\0" * 64)
    with pytest.raises(UsageError):
        merge_ledgers(list(inputs), tmp_path / "out.db")
    assert not (tmp_path / "out.db").exists()


def test_merge_writes_exactly_the_merged_rows(inputs, tmp_path):
    merge_ledgers(list(inputs), tmp_path / "out.db")
    assert count(tmp_path / "out.db") == 18


def test_merge_leaves_no_file_beside_its_output(inputs, tmp_path):
    merge_ledgers(list(inputs), tmp_path / "out.db")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("which", [0, 1])
def test_merge_leaves_its_inputs_byte_identical(inputs, tmp_path, which):
    before = sha(inputs[which])
    merge_ledgers(list(inputs), tmp_path / "out.db")
    assert sha(inputs[which]) == before


def test_merge_reads_an_old_ledger_through_a_migrated_copy(inputs, tmp_path):
    old = copy_ledger(LEGACY, tmp_path / "old.db")
    before, applied = sha(old), applied_migrations(old)
    merge_ledgers([old, inputs[0]], tmp_path / "out.db")
    assert (sha(old), applied_migrations(old)) == (before, applied)


def test_the_merge_of_an_old_ledger_holds_its_rows(inputs, tmp_path):
    old = copy_ledger(LEGACY, tmp_path / "old.db")
    merge_ledgers([old, inputs[0]], tmp_path / "out.db")
    assert count(tmp_path / "out.db") == count(old) + 6


def test_a_merged_ledger_passes_the_integrity_check(inputs, tmp_path):
    merge_ledgers(list(inputs), tmp_path / "out.db")
    assert integrity(tmp_path / "out.db") == []


# --- opening and closing -----------------------------------------------------------------------------


def test_a_ledger_closes_when_its_block_ends(tmp_path):
    with open_ledger(tmp_path / "l.db") as led:
        pass
    assert led.closed


def test_a_read_only_ledger_refuses_writes(tmp_path):
    small_ledger(tmp_path / "l.db", "r1", 1)
    with open_ledger(tmp_path / "l.db", read_only=True) as led, pytest.raises(LedgerWriteError):
        led.update_run("r1", {"status": "x"})


def test_a_read_only_open_never_migrates(tmp_path):
    old = copy_ledger(LEGACY, tmp_path / "old.db")
    with pytest.raises(LedgerError, match="older evalkit schema"):
        open_ledger(old, read_only=True)


@pytest.mark.parametrize("args", [["ledger", "migrate"], ["ledger", "check"], ["report", "--json"]])
def test_a_command_closes_the_ledger_it_opened(tmp_path, args):
    small_ledger(tmp_path / "l.db", "r1", 2)
    CliRunner().invoke(cli, [*args, "--ledger", str(tmp_path / "l.db")])
    assert [p for p, where in open_ledgers() if where.startswith(str(PACKAGE_DIR))] == []


def test_a_failing_command_closes_the_ledger_it_opened(tmp_path):
    small_ledger(tmp_path / "l.db", "r1", 2)
    r = CliRunner().invoke(cli, ["report", "--run", "nope", "--ledger", str(tmp_path / "l.db")])
    assert r.exit_code == 2
    assert [p for p, where in open_ledgers() if where.startswith(str(PACKAGE_DIR))] == []


# --- against other processes ---------------------------------------------------------------------------

WRITER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1])
c.execute("pragma journal_mode=wal"); c.execute("pragma wal_autocheckpoint=0")
c.execute("create table requests (id integer primary key, text)")
c.executemany("insert into requests (text) values (?)", [("old run",)] * 300)
c.commit()
print("written", flush=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_the_issues_merge_case_is_refused_in_one_line_naming_the_leftover_wal(tmp_path):
    # a writer of out.db is killed with 300 rows still in its -wal; the user deletes out.db and merges
    out = tmp_path / "out.db"
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "written"
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    out.unlink()
    a, b = small_ledger(tmp_path / "a.db", "r-a", 6), small_ledger(tmp_path / "b.db", "r-b", 12)
    r = subprocess.run([*CLI, "ledger", "merge", str(a), str(b), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [next(x for x in r.stderr.splitlines() if "out.db-wal is left over" in x)]


@pytest.mark.integration
def test_the_issues_merge_case_writes_no_output(tmp_path):
    out = tmp_path / "out.db"
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        w.stdout.readline()
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    out.unlink()
    a, b = small_ledger(tmp_path / "a.db", "r-a", 6), small_ledger(tmp_path / "b.db", "r-b", 12)
    subprocess.run([*CLI, "ledger", "merge", str(a), str(b), "-o", str(out)], capture_output=True, text=True)
    assert not out.exists()


FAKE_PYSQLITE3 = "from sqlite3 import *  # noqa\nfrom sqlite3 import dbapi2  # noqa\n"


@pytest.mark.integration
@pytest.mark.parametrize("first", ["evalkit.ledger", "sqlite_utils"])
def test_one_sqlite_library_whichever_is_imported_first(tmp_path, first):
    # a pysqlite3 on the path: sqlite-utils would take it, a second SQLite library beside evalkit's
    (tmp_path / "pysqlite3").mkdir()
    (tmp_path / "pysqlite3" / "__init__.py").write_text(FAKE_PYSQLITE3)
    (tmp_path / "pysqlite3" / "dbapi2.py").write_text("from sqlite3.dbapi2 import *  # noqa\n")
    code = f"import {first}\nimport evalkit.ledger\nfrom sqlite_utils import utils\nprint(utils.sqlite3.__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": f"{tmp_path}:{PROJECT_DIR}"})
    want = "sqlite3" if first == "evalkit.ledger" else "two SQLite libraries"
    assert want in r.stdout + r.stderr, r.stderr[-500:]


@pytest.mark.integration
def test_a_kill_during_a_copy_leaves_no_file_under_the_final_name(tmp_path):
    src = small_ledger(tmp_path / "big.db", "r1", 200_000)
    expect_rows(src, "requests", 200_000)
    code = "import sys; from evalkit.ledger import copy_ledger; copy_ledger(sys.argv[1], sys.argv[2])"
    p = subprocess.Popen([sys.executable, "-c", code, str(src), str(tmp_path / "copy.db")])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [x for x in tmp_path.iterdir() if x.name.startswith(".copy.db")]:
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (tmp_path / "copy.db").exists() or integrity(tmp_path / "copy.db") == []


# --- the suite's own last check ------------------------------------------------------------------------


@pytest.fixture
def fresh_registry(monkeypatch, tmp_path):
    """The integrity check's registrations, empty, as a process that registered nothing has them.
    The made-up worker's folder goes when the test ends: the session's own check would read it."""
    from . import ledger_integrity as li

    for name, value in (("DELIBERATE", set()), ("EXPECTED", {}), ("MADE_BY", {})):
        monkeypatch.setattr(li, name, value)
    yield li
    shutil.rmtree(tmp_path / "popen-gw1", ignore_errors=True)


def worker_folder(li, base: Path) -> None:
    """What one xdist worker leaves: a deliberately broken file and a ledger of 2 rows it expects."""
    folder = base / "popen-gw1" / "test_x0"
    folder.mkdir(parents=True)
    (folder / "broken.db").write_bytes(b"SQLite format 3\x00" + b"\x07" * 200)
    li.not_a_ledger(folder / "broken.db")
    small_ledger(folder / "l.db", "r1", 2)
    li.expect_rows(folder / "l.db", "requests", 3)  # one more than it wrote: the check must say so
    li.MADE_BY[str(folder.resolve())] = "tests/test_x.py::test_x"
    li.save(base / "popen-gw1")
    li.DELIBERATE.clear()
    li.EXPECTED.clear()
    li.MADE_BY.clear()


@pytest.mark.integration  # the check runs in a separate process
def test_the_checking_process_knows_a_workers_deliberately_broken_file(fresh_registry, tmp_path):
    worker_folder(fresh_registry, tmp_path)
    fresh_registry.load(tmp_path)
    assert not [b for b in fresh_registry.check(tmp_path) if "broken.db" in b]


@pytest.mark.integration  # the check runs in a separate process
def test_the_checking_process_holds_a_worker_to_the_rows_it_expected(fresh_registry, tmp_path):
    worker_folder(fresh_registry, tmp_path)
    fresh_registry.load(tmp_path)
    assert [b for b in fresh_registry.check(tmp_path) if "l.db" in b] == [
        f"{(tmp_path / 'popen-gw1' / 'test_x0' / 'l.db')} (made by tests/test_x.py::test_x): requests has 2 rows, "
        "the test wrote 3"]
