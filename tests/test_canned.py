"""Datasette's canned queries a grader declares (`ledger/canned.py`): a "lowest"/"highest" query
lists the rows of `requests_joined` (each request's newest grade of that grader, warm-ups left
out) in the declared order, and SQLite serves it from the grades' index without sorting every
grade (at 10 M requests the view's sort ran past Datasette's 5 s limit)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.grading import refresh_view
from evalkit.grading.registry import available
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.sharing.browse import queries

from .test_case_reads import swept  # noqa: F401  (the re-graded sweep those reads are checked on)

ORDERED = [(g, q) for g, cls in sorted(available().items()) for q in cls.aggregate.canned_queries
           if q.kind in ("lowest", "highest")]


@pytest.fixture(scope="module")
def browsed(swept: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    path = copy_ledger(swept, tmp_path_factory.mktemp("canned") / "browsed.db")
    db = Database(path)
    db.execute("update requests set is_warmup = 1 where id % 13 = 0")  # warm-ups are never listed
    db.conn.commit()
    db.close()
    with open_ledger(path, create=False) as led:
        refresh_view(led)
    return path


def _definition(path: Path, grader: str, column: str, kind: str) -> list[tuple[Any, ...]]:
    """The 50 rows by the view's definition, in Python: each measured request's newest grade of
    ``grader`` (highest id), where its field is set; ties in the grade's id order."""
    field = dict(available()[grader].aggregate.view_columns)[column]
    db = Database(path)
    newest: dict[int, dict[str, Any]] = {}
    for g in db.query("select * from grades where grader = ? order by id", [grader]):
        newest[g["request_id"]] = g
    rows = {r["id"]: r for r in db.query(
        "select r.id, r.run_id, r.variant, r.case_id, r.is_warmup, r.text, c.complexity from requests r "
        "join runs u on u.id = r.run_id left join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash")}
    db.close()
    kept = [(g[field], g["id"], rows[rid]) for rid, g in newest.items()
            if g[field] is not None and rid in rows and not rows[rid]["is_warmup"]]
    kept.sort(key=lambda x: (x[0], x[1]), reverse=kind == "highest")
    return [(r["run_id"], r["variant"], r["case_id"], r["complexity"], v, r["text"]) for v, _, r in kept[:50]]


@pytest.mark.parametrize(("grader", "query"), ORDERED, ids=[q.name for _, q in ORDERED])
def test_an_ordered_canned_query_lists_the_newest_grades_in_order(browsed, grader, query):
    sql = queries()[query.name]["sql"]
    with sqlite3.connect(browsed) as con:
        got = con.execute(sql).fetchall()
    con.close()
    assert got == _definition(browsed, grader, query.column, query.kind)


@pytest.mark.parametrize(("grader", "query"), ORDERED, ids=[q.name for _, q in ORDERED])
def test_an_ordered_canned_query_lists_something_on_the_sweep(browsed, grader, query):
    assert _definition(browsed, grader, query.column, query.kind)


@pytest.mark.parametrize(("grader", "query"), ORDERED, ids=[q.name for _, q in ORDERED])
def test_an_ordered_canned_query_reads_the_grades_index_in_order(browsed, grader, query):
    with sqlite3.connect(browsed) as con:
        plan = " | ".join(r[-1] for r in con.execute("explain query plan " + queries()[query.name]["sql"]))
    con.close()
    assert "TEMP B-TREE" not in plan, plan
