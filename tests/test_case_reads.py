"""Quality under load and flips as ledger queries (issue 48, `ledger/case_reads.py`): every
entry equal to the definition computed in plain Python over the rows (each grader's own
`margin_values`; the verdicts' own `flips.passes`), on a sweep shaped at the margins (every built-in margin grader with grades of
every shape it reads, re-grades and failed grades, failed requests, an open-loop and an unlabelled
concurrency-1 level beside the reference), and a grader that declares nothing read through its
`margin_values` to the same numbers."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.catalogue import CaseValue
from evalkit.errors import PluginError
from evalkit.grading.base import Aggregate, Margin, declared_case_summary, declared_case_values, paired_differences
from evalkit.grading.registry import available
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.reporting import flips, under_load
from evalkit.reporting.by_attr import slice_value
from evalkit.stats import bootstrap_ci, mean

from .report_golden import synth as _synth
from .test_level_reads import shaped_copy


def _detail(grader: str, rng: random.Random) -> tuple[float | None, int | None, dict]:
    """(value, passed, detail) of one grade of ``grader``, of each shape its `margin_values` reads."""
    x = round(rng.uniform(0, 1), 6) if rng.random() > 0.1 else None
    if grader == "persona":  # its rules: some missing, some without a pass, some passes as numbers
        rules = {name: {"passed": rng.choice([True, False, True, None, 0, 1])}
                 for name in ("mentions_company", "tone \"plain\"") if rng.random() < 0.8}
        return x, rng.choice([None, 0, 1, 1]), {"rules": rules} if rng.random() < 0.9 else {}
    if grader == "judge":
        return x, None, {}
    if grader == "drift":
        return x, None, {"kind": rng.choice(["drift", "noise_floor", "other"]), "drift": rng.uniform(0, 0.3)}
    if grader == "divergence":
        d = {"kind": rng.choice(["floor", "candidate"]), "status": rng.choice(["ok", "ok", "refused", None]),
             "kl_mean": rng.choice([None, rng.expovariate(20)]), "top1_pct": rng.uniform(80, 100),
             "greedy_drift": rng.uniform(0, 0.1), "top_k": 20, "tail_mean": rng.choice([None, rng.uniform(0, 0.05)]),
             "tail_max": rng.uniform(0, 0.2)}
        if d["status"] == "refused" and rng.random() < 0.5:
            d["reason"] = "another tokenizer"
        return x, None, d
    if grader == "formality":  # its estimators disagree now and then
        predicted, requested = rng.randint(1, 5), rng.randint(1, 5)
        d = {"requested": requested, "predicted": predicted, "error": predicted - requested,
             "embed_level": rng.randint(1, 5), "estimators_disagree": rng.random() < 0.05}
        return float(abs(predicted - requested) <= 1), None, d if rng.random() < 0.95 else {}
    if grader == "accuracy":
        d = {"suite": rng.choice(["gsm8k", "mmlu", ""])} if rng.random() < 0.7 else {}
        return rng.choice([None, 0.0, 1.0, 1.0]), None, d
    if grader == "load_drift":
        return None, rng.choice([0, 1, None]), {"drift": rng.uniform(0, 0.2)} if rng.random() < 0.9 else {}
    raise AssertionError(grader)


GRADERS = ("persona", "judge", "drift", "divergence", "accuracy", "load_drift", "formality")
SHAPE = [
    # a concurrency-1 level of another label sent before the reference, and open-loop requests at 1
    "update requests set level = 'warm' where level = 'c=1' and variant = 'w8a8' and id % 5 = 0",
    "update requests set scheduled_ms = 10.0 where level = 'c=1' and variant = 'base' and id % 7 = 0",
    # the baseline's last repeat is its noise-floor pass: no candidate sent it
    "delete from requests where variant = 'w8a8' and repeat = 4",
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("qul") / "synth.db"
    _synth().synthesize(base, 2400, ["base", "w8a8"], [1, 4], seed=11)
    path = shaped_copy(base, base.with_name("swept.db"), SHAPE)
    db = Database(path)
    rng = random.Random(3)
    run_id = db.execute("select id from runs").fetchone()[0]
    # a case#repeat sent twice on a side (loaded and one at a time): the copy sent after it, or before
    again = [{**{k: v for k, v in r.items() if k != "id"},
              "seq": -r["seq"] if r["variant"] == "base" and r["id"] % 2 else r["seq"] + 10**6}
             for r in db.query("select * from requests where id % 9 = 0 and (concurrency = 4 or level = 'c=1')")]
    db["requests"].insert_all(again)
    ids = [r[0] for r in db.execute("select id from requests where run_id = ?", [run_id]).fetchall()]
    grades = []
    for rid in ids:
        for g in GRADERS:
            for attempt in range(rng.choice([1, 1, 1, 2])):  # a re-grade: the newest counts
                value, passed, detail = _detail(g, rng)
                err = "Boom" if attempt == 0 and rng.random() < 0.03 else None  # a failed grade is not read
                grades.append({"request_id": rid, "run_id": run_id, "grader": g, "grader_version": "1",
                               "value": value, "passed": passed, "detail_json": json.dumps(detail),
                               "error_class": err})
    db["grades"].insert_all(grades)
    db.conn.commit()
    db.close()
    return path


def _reference(path: Path) -> list[dict[str, Any]]:
    """Quality under load by its definition (the module docstrings), in plain Python."""
    db = Database(path)
    run_id = db.execute("select id from runs").fetchone()[0]
    rows = list(db.query(
        "select r.* from measured r join runs u on u.id = r.run_id join cases c on c.id = r.case_id "
        "and c.dataset_hash = u.dataset_hash where r.run_id = ? order by r.seq, r.id", [run_id]))
    latest: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for g in db.query("select * from grade_latest where run_id = ? order by id", [run_id]):
        g["detail"] = json.loads(g["detail_json"] or "{}")
        latest[g["request_id"]][g["grader"]] = g
    db.close()
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        ok = [r for r in rows if r["variant"] == v and r["error_class"] is None]
        top = max((r["concurrency"] or 1) for r in ok)
        one = [r for r in ok if (r["concurrency"] or 1) == 1 and r["scheduled_ms"] is None]
        one = [r for r in one if r["level"] == "c=1"] or one
        load = [r for r in ok if (r["concurrency"] or 1) == top]
        if top <= 1 or not one:
            continue

        def grades(rs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
            return [{**latest[r["id"]][name], "case_id": f"{r['case_id']}#{r['repeat']}"} for r in rs
                    if name in latest[r["id"]]]

        lg = [g for r in load for g in [latest[r["id"]].get("load_drift")] if g]
        e = {"variant": v, "level": top, "pairs": len(lg), "deltas": {},
             "identical_pct": 100.0 * sum(bool(g["passed"]) for g in lg) / len(lg) if lg else None,
             "drift_mean": mean([g["detail"].get("drift") for g in lg])}
        for name, cls in available().items():
            for m, d in paired_differences(cls, grades(load, name), grades(one, name)).items():
                if d:
                    ci = bootstrap_ci(d)
                    e["deltas"][m] = {"delta": mean(d), "ci95": list(ci) if ci else None, "pairs": len(d)}
        e["pairs"] = max([e["pairs"], *(x["pairs"] for x in e["deltas"].values())])
        out.append(e)
    return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture(scope="module")
def entries(swept: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with open_ledger(swept, create=False) as db:
        got = under_load.quality_under_load(db, db.require_run(None)["id"])
    return got, _reference(swept)


def test_every_variant_with_a_loaded_level_has_an_entry(entries):
    got, want = entries
    assert [e["variant"] for e in got] == [e["variant"] for e in want] == ["base", "w8a8"]


@pytest.mark.parametrize("key", ["level", "pairs", "identical_pct", "drift_mean"])
def test_an_entry_s_outline_is_its_definition(entries, key):
    got, want = entries
    assert [_close(g[key], w[key]) for g, w in zip(got, want, strict=True)] == [True, True], (got, want)


def test_every_built_in_margin_has_pairs_to_compare(entries):
    got, _ = entries
    assert set(got[0]["deltas"]) >= {"schema_pass", "persona_pass", "formality_mae", "drift", "judge", "kl",
                                     "top1_agreement", "greedy_drift", "accuracy", "accuracy:gsm8k", "accuracy:?"}


@pytest.mark.parametrize("variant", [0, 1])
def test_each_margin_s_paired_difference_is_its_margin_values(entries, variant):
    got, want = entries
    g, w = got[variant]["deltas"], want[variant]["deltas"]
    assert sorted(g) == sorted(w)
    assert [m for m in g if not _close(g[m], w[m])] == []


def test_a_grader_that_declares_nothing_is_read_through_its_margin_values(swept, entries, monkeypatch):
    """The road for a plugin that overrides `margin_values` alone gives the same entries."""
    monkeypatch.setattr(under_load, "declared_case_values", lambda cls, side: None)
    with open_ledger(swept, create=False) as db:
        read = under_load.quality_under_load(db, db.require_run(None)["id"])
    assert _close(read, entries[0])


def test_a_run_without_a_loaded_level_has_no_entry(swept, tmp_path):
    path = copy_ledger(swept, tmp_path / "flat.db")
    db = Database(path)
    db.execute("update requests set concurrency = 1, level = 'c=1'")
    db.conn.commit()
    db.close()
    with open_ledger(path, create=False) as led:
        assert under_load.quality_under_load(led, led.require_run(None)["id"]) == []


@pytest.mark.parametrize("name", sorted(n for n, c in available().items() if c.aggregate.margins))
@pytest.mark.parametrize("side", [False, True])
def test_every_built_in_margin_grader_declares_its_case_values(name, side):
    got = declared_case_values(available()[name], side)
    assert got is not None and set(got) == {m.name for m in available()[name].aggregate.margins}


class _Own(Aggregate):
    margins = (Margin("own", "abs", True, "a plugin's"),)

    @classmethod
    def margin_values(cls, grades, baseline_side):
        return {"own": {}}


class _OwnOfABuiltIn(available()["formality"].aggregate):  # type: ignore[misc,name-defined]
    @classmethod
    def margin_values(cls, grades, baseline_side):
        return {"formality_mae": {}}


class _Plain:  # a user's aggregate that is no `Aggregate` at all
    margins = (Margin("own", "abs", True, "a plugin's"),)

    @classmethod
    def margin_values(cls, grades, baseline_side):
        return {"own": {}}


class _Default(Aggregate):
    margins = (Margin("share", "pp", True, "a plugin's"), Margin("mean", "abs", True, "a plugin's"))


def _grader(agg: type[Aggregate]) -> Any:
    return type("G", (), {"name": "plug", "aggregate": agg})


@pytest.mark.parametrize("agg", [_Own, _OwnOfABuiltIn, _Plain], ids=["own", "own-of-a-built-in", "plain"])
def test_an_aggregate_that_overrides_margin_values_alone_declares_nothing(agg):
    assert declared_case_values(_grader(agg), False) is None


class _OwnSummaryOfDrift(available()["drift"].aggregate):  # type: ignore[misc,name-defined]
    @classmethod
    def summarise(cls, grades, base_grades):
        return {}


def test_the_built_in_summaries_declared_through_cases_are_drift_s():
    assert [n for n, c in sorted(available().items()) if declared_case_summary(c) is not None] == ["drift"]


@pytest.mark.parametrize("agg", [_OwnSummaryOfDrift, _Default, _Plain], ids=["own-summarise", "default", "plain"])
def test_an_aggregate_that_does_not_declare_its_summary_through_cases_is_handed_grades(agg):
    assert declared_case_summary(_grader(agg)) is None


def test_the_default_margin_values_is_declared_as_it_computes():
    assert declared_case_values(_grader(_Default), True) == {"share": CaseValue("passed", first=True),
                                                             "mean": CaseValue("value")}


def test_a_declaration_that_is_not_case_values_is_one_line():
    class Bad(_Default):
        @classmethod
        def case_values(cls, baseline_side):
            return {"share": "passed"}

    with pytest.raises(PluginError, match="must return a dict of margin name -> CaseValue"):
        declared_case_values(_grader(Bad), False)


@pytest.mark.parametrize("kw", [{"source": "score"}, {"source": "detail.a-b"}, {"source": "detail."},
                                {"source": "value", "where": (("kind'", "x"),)}])
def test_a_case_value_names_only_what_a_grade_has(kw):
    with pytest.raises(ValueError, match="CaseValue"):
        CaseValue(**kw)


def _flip_reference(path: Path, by: tuple[str, ...], repeats: int | None) -> list[dict[str, Any]]:
    """The flip table by its definition (docs in `reporting/flips.py`), over each variant's first
    level as rows, with the verdicts' own `passes` and `count`."""
    db = Database(path)
    run_id = db.execute("select id from runs").fetchone()[0]
    rows = list(db.query(
        "select r.*, c.complexity as case_complexity, c.attributes_json from measured r join runs u on u.id = r.run_id "
        "join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash where r.run_id = ? order by r.seq, r.id",
        [run_id]))
    latest: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for g in db.query("select * from grade_latest where run_id = ? order by id", [run_id]):
        g["detail"] = json.loads(g["detail_json"] or "{}")
        latest[g["request_id"]][g["grader"]] = g
    db.close()
    first = {v: min(r["load_level"] for r in rows if r["variant"] == v) for v in {r["variant"] for r in rows}}
    rows = [{**r, "grades": latest[r["id"]], "complexity": r["case_complexity"],
             "attributes": json.loads(r["attributes_json"] or "{}")} for r in rows if r["load_level"] == first[r["variant"]]
            and (repeats is None or r["variant"] != "base" or r["repeat"] < repeats)]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(slice_value(r, k) for k in by)].append(r)
    out = []
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        rs = groups[key]
        mine = {r["repeat"] for r in rs if r["variant"] == "base"}
        others = {r["repeat"] for r in rs if r["variant"] != "base"}
        floor_rep = min(mine - others) if mine - others and others else None
        rules: dict[str, set[str]] = defaultdict(set)
        for r in rs:
            for name, g in r["grades"].items():
                rules[name].update(((g.get("detail") or {}).get("rules") or {}).keys())
        for variant in sorted({r["variant"] for r in rs} - {"base"}):
            for metric, grader in flips.flip_metrics().items():
                for rule in [None, *sorted(rules.get(grader, ()))]:
                    base = flips.passes(rs, "base", grader, rule)
                    n, gains, losses = flips.count(base, flips.passes(rs, variant, grader, rule))
                    if not n:
                        continue
                    fl = None
                    if floor_rep is not None:
                        fn, fg, flo = flips.count(base, flips.passes(rs, "base", grader, rule, floor_rep))
                        fl = 100.0 * (fg + flo) / fn if fn else None
                    out.append({**({"group": key} if by else {}), "variant": variant, "metric": metric,
                                "grader": grader, "rule": rule, "cases": n, "gains": gains, "losses": losses,
                                "floor_flip_pct": fl})
    return out


@pytest.mark.parametrize(("by", "repeats"), [((), None), (("complexity",), 4), (("persona", "complexity"), None)],
                         ids=["table", "by-complexity", "by-attribute"])
def test_the_flip_table_is_its_definition_over_the_rows(swept, by, repeats):
    with open_ledger(swept, create=False) as db:
        got = flips.flips(db, db.require_run(None)["id"], "base", by, repeats)
    keep = ("group", "variant", "metric", "grader", "rule", "cases", "gains", "losses", "floor_flip_pct")
    assert [{k: e[k] for k in keep if k in e} for e in got] == _flip_reference(swept, by, repeats)


def test_the_flip_table_has_rules_and_a_floor_to_compare(swept):
    with open_ledger(swept, create=False) as db:
        got = flips.flips(db, db.require_run(None)["id"], "base")
    assert {e["rule"] for e in got} >= {None, "mentions_company", 'tone "plain"'}
    assert all(e["floor_flip_pct"] is not None for e in got)


def test_a_run_without_a_baseline_has_no_flips(swept):
    with open_ledger(swept, create=False) as db:
        assert flips.flips(db, db.require_run(None)["id"], None) == []


@pytest.mark.parametrize("name", ["formality", "divergence"])
def test_notes_handed_the_rows_they_declare_say_what_every_row_says(swept, name):
    from evalkit.grading.base import declared_notes_where, hook
    from evalkit.reporting.rows import NotedRows, RunRows

    cls = available()[name]
    with open_ledger(swept, create=False) as db:
        run_id = db.require_run(None)["id"]
        everything, noted = RunRows(db, run_id), NotedRows(db, run_id, name, declared_notes_where(cls))
        assert 0 < len(noted) < len(everything)
        lines = hook(cls, "notes", everything)
        assert lines and hook(cls, "notes", noted) == lines


def test_the_noted_rows_are_those_whose_grade_sets_a_field(swept):
    db = Database(swept)
    run_id = db.execute("select id from runs").fetchone()[0]
    want = [r[0] for r in db.execute(
        "select r.id, g.detail_json from measured r join grade_latest g on g.request_id = r.id "
        "where r.run_id = ? and g.grader = 'formality' order by r.seq, r.id", [run_id])
        if json.loads(r[1] or "{}").get("estimators_disagree")]
    db.close()
    with open_ledger(swept, create=False) as led:
        assert led.noted_ids(run_id, "formality", ("estimators_disagree",)) == want


def test_notes_overridden_alone_are_handed_every_row():
    from evalkit.grading.base import declared_notes_where

    class Own(available()["formality"].aggregate):  # type: ignore[misc,name-defined]
        @classmethod
        def notes(cls, rows):
            return []

    assert declared_notes_where(_grader(Own)) is None


@pytest.mark.parametrize("bad", [(), ("a-b",), "estimators_disagree", (1,)])
def test_a_notes_where_that_is_not_detail_keys_is_one_line(bad):
    from evalkit.grading.base import declared_notes_where

    class Bad(Aggregate):
        notes_where = bad

    with pytest.raises(PluginError, match="notes_where"):
        declared_notes_where(_grader(Bad))


def _failure_lines(db: Any, run_id: str) -> list[str]:
    """`grading.grade_failures` by its definition: the newest grade of each (request, grader,
    version) an error, grouped in the order they came; out of the requests the graders are handed."""
    from evalkit.grading import graded_requests

    errors = db.grade_errors(run_id)
    items, _ = graded_requests(db, run_id)
    by: dict[str, list[dict[str, Any]]] = {}
    for e in errors:
        by.setdefault(e["grader"], []).append(e)
    out = []
    for name, es in by.items():
        kinds = {(e["error_class"], e["error"]) for e in es}
        out.append(f"{name} failed on {len(es)} of {len(items)} requests: "
                   + f"{es[0]['error_class']} {es[0]['error'] or ''}".strip()
                   + (f" (and {len(kinds) - 1} other error(s))" if len(kinds) > 1 else "")
                   + f"; first: case {es[0]['case_id']} ({es[0]['variant']})")
    return out


FAILURES = {
    "as_shaped": [],  # the sweep's own failed grades
    "none": ["delete from grades where error_class is not null"],
    # two graders fail, one with two kinds of error and an empty message; a failure graded again
    # since (it no longer counts); an error of an older version a newer one replaced (it still does)
    "mixed": ["update grades set error_class = 'KeyError', error = '''x''', value = null, passed = null "
              "where grader = 'persona' and request_id % 11 = 0",
              "update grades set error_class = 'ValueError', error = case when request_id % 2 = 0 then '' else 'bad' end "
              "where grader = 'persona' and request_id % 13 = 0",
              "update grades set error_class = 'RuntimeError', error = 'boom' where grader = 'judge' and request_id % 17 = 0",
              "insert into grades (run_id, request_id, grader, grader_version, value, passed, explanation, detail_json, "
              "created_at) select run_id, request_id, grader, grader_version, 1.0, 1, 'again', '{}', created_at "
              "from grades where grader = 'judge' and request_id % 34 = 0 and error_class is not null",
              "insert into grades (run_id, request_id, grader, grader_version, value, passed, explanation, detail_json, "
              "created_at) select run_id, request_id, grader, 'v0', 1.0, 1, 'old', '{}', created_at "
              "from grades where grader = 'judge' and request_id % 17 = 0"],
    # a trace prompt is handed to no grader: not counted among the requests
    "trace_cases": ["update cases set task = 'trace' where id in (select case_id from requests where id % 3 = 0)",
                    "update grades set error_class = 'KeyError', error = 'k' where grader = 'drift' and request_id % 7 = 0"],
}


@pytest.mark.parametrize("shape", sorted(FAILURES))
def test_the_grade_failures_the_ledger_counts_are_their_definition(swept: Path, tmp_path: Path, shape: str) -> None:
    from evalkit.grading import grade_failures

    path = shaped_copy(swept, tmp_path / "failed.db", FAILURES[shape])
    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
        want = _failure_lines(db, run_id)
        assert grade_failures(db, run_id) == want
    assert bool(want) == (shape != "none")


@pytest.mark.parametrize("shape", [[], ["delete from requests where variant = 'w8a8' and case_id in "
                                        "(select case_id from requests where variant = 'w8a8' limit 7)",
                                        "update requests set concurrency = 2 where variant = 'base' and concurrency = 1"]],
                         ids=["as_shaped", "cases_and_a_level_apart"])
def test_the_pairs_a_reviewer_can_be_shown_are_their_definition(swept: Path, tmp_path: Path, shape: list[str]) -> None:
    """Each candidate's cases at its first level that the baseline sent at its own first level."""
    from evalkit.reporting.rows import request_rows
    from evalkit.reporting.selection import first_level

    path = shaped_copy(swept, tmp_path / "reviewable.db", shape)
    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
        rows = request_rows(db, run_id)
        cases: dict[str, set[str]] = defaultdict(set)
        for r in first_level(rows):
            cases[r["variant"]].add(r["case_id"])
        want = sum(len(c & cases["base"]) for v, c in cases.items() if v != "base")
        assert db.reviewable_pairs(run_id, "base") == want
