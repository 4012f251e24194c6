"""The ledger's columnar copy (issue 48, ledger/columnar.py): queries read DuckDB's copy of the
requests and grades, made once per ledger state; a write by anyone makes the next query read the
new state; where no copy can be made, the ledger itself answers the same."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from evalkit.ledger import copy_ledger, open_ledger
from evalkit.ledger.columnar import copy_path

from .report_golden import synth as _synth

SUMS = ("select count(*), sum(e2e_ms), sum(ok::int), (select count(*) from l.grade_latest), "
        "(select sum(value) from l.grade_latest), (select count(*) from l.runs) from l.measured")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("columnar") / "source.db"
    _synth().synthesize(path, 600, ["base", "w8a8"], [1], seed=5)
    return path


@pytest.fixture
def ledger(source: Path, tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    copy_ledger(source, path)
    return path


def _sums(path: Path) -> tuple:
    with open_ledger(path, create=False) as db:
        return db.query(SUMS)[1][0]


def _plain(path: Path) -> tuple:
    """The same figures from SQLite itself."""
    con = sqlite3.connect(path)
    try:
        return con.execute(SUMS.replace("l.", "").replace("ok::int", "ok")).fetchone()
    finally:
        con.close()


def _key(path: Path) -> tuple[int, int, int]:
    con = sqlite3.connect(path)
    try:
        return con.execute("select n, tag, tail from ledger_changes").fetchone()
    finally:
        con.close()


def test_a_query_makes_the_copy_beside_the_ledger(ledger):
    _sums(ledger)
    assert copy_path(ledger).is_file()


def test_the_copy_answers_what_sqlite_answers(ledger):
    assert _sums(ledger) == pytest.approx(_plain(ledger), rel=1e-12)


@pytest.mark.parametrize("change", [
    "update requests set final = 0 where id = (select min(id) from requests where is_warmup = 0)",
    "delete from requests where id = (select max(id) from requests)",
    "insert into requests (run_id, variant, case_id, is_warmup, final, e2e_ms) "
    "select run_id, variant, case_id, 0, 1, 12345.0 from requests limit 1",
    "update grades set value = value + 1 where id = (select max(id) from grades where error_class is null)",
    "insert into grades (request_id, run_id, grader, value) select request_id, run_id, grader, 7.0 from grades limit 1",
    "delete from grades where id = (select max(id) from grades)",
], ids=["request final", "request deleted", "request added", "grade changed", "grade added", "grade deleted"])
def test_a_write_by_another_hand_is_read_by_the_next_query(ledger, change):
    before = _sums(ledger)
    con = sqlite3.connect(ledger)  # not evalkit: any writer counts
    with con:
        con.execute(change)
    con.close()
    after = _sums(ledger)
    assert (after != before, after) == (True, pytest.approx(_plain(ledger), rel=1e-12))


@pytest.mark.parametrize("table", ["requests", "grades", "runs", "cases"])
@pytest.mark.parametrize("event", ["insert", "update", "delete"])
def test_every_write_of_a_copied_table_counts_and_draws_a_tag(ledger, table, event):
    column = "run_id" if table in ("requests", "grades") else "id"  # runs' and cases' ids are texts
    sql = {"insert": f"insert into {table} ({column}) values ('x')", "update": f"update {table} set id = id "
           f"where id = (select min(id) from {table})", "delete": f"delete from {table} where id = (select max(id) from {table})"}
    before = _key(ledger)
    con = sqlite3.connect(ledger)
    with con:
        con.execute(sql[event])
    con.close()
    n, tag, tail = _key(ledger)
    drawn = "tail" if event == "insert" else "tag"  # an insert can be appended to the copy; the rest cannot
    assert (n, tag != before[1], tail != before[2]) == (before[0] + 1, drawn == "tag", drawn == "tail")


def test_a_copy_of_another_ledger_is_not_read(ledger, source, tmp_path):
    _sums(source)
    os.replace(copy_path(source), copy_path(ledger))  # a copy whose key is another ledger's
    con = sqlite3.connect(ledger)
    with con:
        con.execute("update requests set e2e_ms = e2e_ms * 2")
    con.close()
    assert _sums(ledger) == pytest.approx(_plain(ledger), rel=1e-12)


def test_where_no_copy_can_be_made_the_ledger_answers_the_same(ledger):
    copy_path(ledger).mkdir()  # the copy's name taken by a folder: the rename fails
    got = _sums(ledger)
    assert (got, copy_path(ledger).is_dir()) == (pytest.approx(_plain(ledger), rel=1e-12), True)


def test_a_damaged_copy_is_made_again(ledger):
    _sums(ledger)
    copy_path(ledger).write_bytes(b"not a duckdb file" * 100)
    assert _sums(ledger) == pytest.approx(_plain(ledger), rel=1e-12)


def test_a_half_made_copy_of_a_dead_builder_is_swept(ledger):
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it
    half = copy_path(ledger).with_name(f"{copy_path(ledger).name}.tmp-{dead}")
    half.write_bytes(b"half")
    _sums(ledger)
    assert half.exists() is False


def test_the_copy_is_made_once_per_state(ledger):
    _sums(ledger)
    first = copy_path(ledger).stat().st_ino
    _sums(ledger)
    assert copy_path(ledger).stat().st_ino == first


def _report(path: Path) -> str:
    from evalkit.reporting.findings import report_findings
    from evalkit.reporting.report import to_json

    with open_ledger(path, create=False) as db:
        rep, _ = report_findings(db, None, slo=None, by=["persona"], k=3.5, margins=None)
        return to_json(rep)


def test_the_report_from_the_copy_equals_the_report_from_the_ledger(ledger, tmp_path):
    other = tmp_path / "other" / "ledger.db"
    other.parent.mkdir()
    copy_ledger(ledger, other)
    copy_path(other).mkdir()  # no copy can be made: the ledger answers
    assert (_report(ledger), copy_path(ledger).is_file()) == (_report(other), True)


def test_a_copy_that_cannot_be_made_is_not_tried_again_by_the_same_worker(ledger, monkeypatch):
    from evalkit.ledger import columnar
    from evalkit.ledger.duck import Duck

    def full_disk(*args: object) -> None:
        calls.append(args)
        raise OSError("No space left on device")

    calls: list[tuple] = []
    monkeypatch.setattr(columnar, "_fill", full_disk)
    for _ in range(2):  # `Duck` in this process (as the query worker runs it): no connection of ours is open on it
        with Duck(ledger) as d:
            got = d.rows("select count(*) from l.requests")
    assert (len(calls), d.copied, got[0][0] > 0) == (1, False, True)


def _write_sql(path: Path, *sqls: str) -> None:
    con = sqlite3.connect(path)  # not evalkit: any writer counts
    with con:
        for sql in sqls:
            con.execute(sql)
    con.close()


_ADD = ("insert into requests (run_id, variant, case_id, is_warmup, final, e2e_ms) "
        "select run_id, variant, case_id, 0, 1, {} from requests limit 1")


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often this process's `Duck` filled a copy whole and extended one (what it kept)."""
    from evalkit.ledger import columnar

    calls = {"fill": 0, "extend": 0}
    for name in ("fill", "extend"):
        real = getattr(columnar, f"_{name}")

        def wrapped(con, key, real=real, name=name):  # noqa: ANN001, ANN202
            done = real(con, key)
            calls[name] += bool(done)
            return done
        monkeypatch.setattr(columnar, f"_{name}", wrapped)
    return calls


def _duck_sums(path: Path) -> tuple:
    from evalkit.ledger.duck import Duck

    with Duck(path) as d:  # in this process (as the query worker runs it): no connection of ours is open on it
        return d.rows(SUMS)[0]


@pytest.mark.parametrize(("change", "made"), [
    ([_ADD.format(111.0)], {"fill": 1, "extend": 1}),
    (["insert into grades (request_id, run_id, grader, value) select request_id, run_id, grader, 7.0 from grades limit 1"],
     {"fill": 1, "extend": 1}),
    (["insert into runs (id) values ('another run')"], {"fill": 1, "extend": 1}),
    ([_ADD.format(111.0), "update requests set e2e_ms = 5 where id = (select min(id) from requests)"],
     {"fill": 2, "extend": 0}),
    (["delete from grades where id = (select max(id) from grades)"], {"fill": 2, "extend": 0}),
    (["insert into requests (id, run_id, variant, case_id, is_warmup, final, e2e_ms) "
      "select -1, run_id, variant, case_id, 0, 1, 99.0 from requests limit 1"], {"fill": 2, "extend": 0}),
], ids=["request inserted", "grade inserted", "run inserted", "then updated", "deleted", "inserted below the last id"])
def test_inserts_extend_the_copy_and_other_writes_make_it_again(ledger, monkeypatch, change, made):
    calls = _counting(monkeypatch)
    _duck_sums(ledger)
    _write_sql(ledger, *change)
    got = _duck_sums(ledger)
    assert (calls, got) == (made, pytest.approx(_plain(ledger), rel=1e-12))


def test_a_copy_from_another_history_of_the_ledger_is_made_again(ledger, tmp_path, monkeypatch):
    twin = tmp_path / "twin.db"
    copy_ledger(ledger, twin)  # the same tag: each goes on inserting rows of its own
    _write_sql(ledger, _ADD.format(1.0))
    _duck_sums(ledger)
    _write_sql(twin, _ADD.format(2.0), _ADD.format(3.0))
    os.replace(copy_path(ledger), copy_path(twin))
    calls = _counting(monkeypatch)
    got = _duck_sums(twin)
    assert (calls, got) == ({"fill": 1, "extend": 0}, pytest.approx(_plain(twin), rel=1e-12))


def test_a_column_the_ledger_gained_makes_the_copy_whole(ledger, monkeypatch):
    calls = _counting(monkeypatch)
    _duck_sums(ledger)
    _write_sql(ledger, "alter table requests add column plugin_field real", _ADD.format(5.0))
    got = _duck_sums(ledger)
    assert (calls, got) == ({"fill": 2, "extend": 0}, pytest.approx(_plain(ledger), rel=1e-12))


# a grade written again (appended: the copy is extended), and an error after it (no newer kept grade)
_REGRADE = ("insert into grades (request_id, run_id, grader, value) "
            "select request_id, run_id, grader, value + 100 from grades where id <= 5")
_ERRORED = ("insert into grades (request_id, run_id, grader, value, error_class) "
            "select request_id, run_id, grader, 1000, 'timeout' from grades where id between 3 and 8")


@pytest.mark.parametrize("writes", [[], [_REGRADE], [_REGRADE, _ERRORED],
                                    [_REGRADE, "update grades set value = 3 where id = 1"]],
                         ids=["as synthesized", "graded again", "then an error", "then updated"])
@pytest.mark.parametrize("copied", [True, False], ids=["the copy", "the ledger"])
def test_the_newest_grades_a_query_keeps_are_the_ledgers_view(ledger, writes, copied):
    from evalkit.ledger.duck import Duck, newest_grades

    if not copied:
        copy_path(ledger).mkdir()  # no copy can be made: the ledger is read
    _duck_sums(ledger)
    _write_sql(ledger, *writes)
    con = sqlite3.connect(ledger)
    graders = [g for (g,) in con.execute("select distinct grader from grades order by 1")]
    want = con.execute("select count(*), sum(value), sum(id) from grade_latest").fetchone()
    con.close()
    with Duck(ledger) as d:
        got = d.rows(f"select count(*), sum(g.value), sum(g.id) from l.grades g where {newest_grades(graders)}")[0]
        assert (d.copied, got) == (copied, pytest.approx(want, rel=1e-12))


def test_a_copy_of_an_older_layout_is_made_again(ledger, monkeypatch):
    import duckdb

    _duck_sums(ledger)
    con = duckdb.connect(str(copy_path(ledger)))  # as an evalkit before `grade_superseded` made it
    con.execute("drop view grade_latest")
    con.execute("drop table grade_superseded")
    con.execute("alter table evalkit_copy drop column layout")
    con.close()
    calls = _counting(monkeypatch)
    _write_sql(ledger, _REGRADE)  # an insert: an extension, were the older copy read
    got = _duck_sums(ledger)
    assert (calls, got) == ({"fill": 1, "extend": 0}, pytest.approx(_plain(ledger), rel=1e-12))
