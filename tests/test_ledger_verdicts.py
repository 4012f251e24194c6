"""`check`'s verdicts read a variant and level at a time (`verdicts.ledger_verdicts`): equal to
the verdicts over the whole run's rows (`verdicts` with each variant's first level, or a sweep's
levels: the definition), on ledgers shaped at the margins: three variants, a sweep where one
candidate skips a level, alternation blocks, failed requests, re-grades and failed grades, and
margins of every kind (latency as % and ms, pass rates, a grader's mean, flips). Also the
comparison view's answers (`Ledger.first_answers`), read on the same ledgers: the rows its
definition (`sharing.compare._first`) picks from the whole run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.grading.registry import available, use_run
from evalkit.ledger import open_ledger
from evalkit.reporting.rows import request_rows
from evalkit.reporting.selection import by_level, by_variant, first_level, is_swept
from evalkit.reporting.verdicts import _reads, family, graders_read, ledger_verdicts, parse_margins, verdicts
from evalkit.sharing.compare import _first

from .report_golden import synth as _synth
from .test_case_reads import _detail
from .test_level_reads import shaped_copy

MARGINS = ("e2e_mean=+5%,ttft_mean=+10%,tpot_mean=2ms,out_tps_mean=-5%,schema_pass=-2pp,persona_pass=-5pp,"
           "drift=0.05,formality_mae=0.2,judge=-0.1,kl=0.02,accuracy=-3pp,flips_max=5pp")
GRADERS = ("persona", "judge", "drift", "divergence", "accuracy", "formality")
SHAPE = [
    # the alternation's blocks: a case's block, the same for every variant
    "update requests set order_block = length(case_id) % 4 + 10 * (concurrency > 1)",
    # failed requests on both sides
    "update requests set error_class = 'ReadTimeout', ttft_ms = null, e2e_ms = null where id % 17 = 0",
    # the third variant never reached the sweep's top level
    "delete from requests where variant = 'int4' and concurrency = 4",
]


def _ledger(base: Path, levels: list[int], seed: int) -> Path:
    _synth().synthesize(base, 2400, ["base", "w8a8", "int4"], levels, seed=seed)
    path = shaped_copy(base, base.with_name(f"shaped-{len(levels)}.db"), SHAPE)
    db = Database(path)
    rng = random.Random(seed)
    run_id = db.execute("select id from runs").fetchone()[0]
    grades = []
    for (rid,) in db.execute("select id from requests where run_id = ?", [run_id]).fetchall():
        for g in GRADERS:
            for attempt in range(rng.choice([1, 1, 2])):  # a re-grade: the newest counts
                value, passed, detail = _detail(g, rng)
                grades.append({"request_id": rid, "run_id": run_id, "grader": g, "grader_version": "1",
                               "value": value, "passed": passed, "detail_json": json.dumps(detail),
                               "error_class": "Boom" if attempt == 0 and rng.random() < 0.03 else None})
    db["grades"].insert_all(grades)
    db.conn.commit()
    db.close()
    return path


@pytest.fixture(scope="module", params=[[1], [1, 4]], ids=["one-level", "swept"])
def shaped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ledger(tmp_path_factory.mktemp("verdicts") / "synth.db", request.param, seed=len(request.param))


def _both(path: Path) -> tuple[list[dict[str, Any]], tuple[bool, list[dict[str, Any]]]]:
    """(the verdicts by the definition over every row, `ledger_verdicts`'), the run's graders registered."""
    with open_ledger(path, create=False) as db:
        run = db.require_run(None)
        use_run(run)
        specs = parse_margins(MARGINS)
        base = db.baseline(run["id"])
        rows = request_rows(db, run["id"])
        swept = is_swept(rows)
        whole = verdicts(first_level(rows), base, specs, levels=by_level(rows, base) if swept else None)
        return whole, ledger_verdicts(db, run["id"], base, specs)


def same(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Equal, numbers within ``rel`` (the ledger sums a case's values in its own order)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rel) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_ledger_verdicts_equal_the_verdicts_over_every_row(shaped: Path) -> None:
    whole, (_, got) = _both(shaped)
    assert same(got, whole)


def test_the_report_s_verdicts_are_the_verdicts_of_the_first_levels_rows(shaped: Path) -> None:
    """The report's verdicts (``levels=False``): each candidate's first level against the
    baseline's, a sweep's other levels left to the gate, as `verdicts` over the first levels' rows."""
    with open_ledger(shaped, create=False) as db:
        run = db.require_run(None)
        use_run(run)
        specs, base = parse_margins(MARGINS), db.baseline(run["id"])
        whole = verdicts(first_level(request_rows(db, run["id"])), base, specs)
        _, got = ledger_verdicts(db, run["id"], base, specs, levels=False)
    assert same(got, whole)


def test_every_kind_of_margin_is_decided_on_pairs(shaped: Path) -> None:
    """The shapes reach every test: each margin of each candidate has pairs (else the equality
    above would hold of empty verdicts); the accuracy grades made here carry a value, no pass,
    so they have no flips."""
    _, (_, got) = _both(shaped)
    assert {e["metric"] for e in got if not e["pairs"]} == {"accuracy_flips"}


def test_block_pairs_are_read(shaped: Path) -> None:
    _, (_, got) = _both(shaped)
    assert {e["paired_by"] for e in got if e["metric"] == "e2e_mean"} == {"block"}


def test_a_sweep_family_holds_every_level_both_reached(shaped: Path) -> None:
    _, (swept, got) = _both(shaped)
    levels = {(e["variant"], e["level"]) for e in got}
    assert levels == ({("w8a8", 1), ("w8a8", 4), ("int4", 1)} if swept else {("w8a8", None), ("int4", None)})


def test_a_sweep_is_said(shaped: Path) -> None:
    _, (swept, _) = _both(shaped)
    assert swept is shaped.name.endswith("-2.db")


@pytest.mark.parametrize(("margins", "graders"), [
    ("e2e_mean=+5%", set()),
    ("schema_pass=-2pp,drift=0.05", {"schema", "drift"}),
    ("flips_max=5pp", {"schema", "persona", "accuracy"}),
])
def test_only_the_margins_graders_are_read(margins: str, graders: set[str]) -> None:
    assert graders_read(parse_margins(margins)) == graders


def test_a_variant_without_tests_has_no_verdicts() -> None:
    assert family("w8a8", [], parse_margins("e2e_mean=+5%")) == []


def test_the_comparison_view_reads_the_answers_its_definition_picks(shaped: Path) -> None:
    with open_ledger(shaped, create=False) as db:
        run_id = db.require_run(None)["id"]
        picked = sorted(r["id"] for r in _first(request_rows(db, run_id)).values())
        assert db.first_answers(run_id) == picked


def test_a_repeat_sent_first_is_not_the_answer_when_a_lower_one_exists(tmp_path: Path) -> None:
    """The lowest repeat wins over the first sent: a case whose repeat 1 went out before its repeat 0."""
    path = _ledger(tmp_path / "synth.db", [1], seed=7)
    db = Database(path)
    case, variant = db.execute("select case_id, variant from requests where repeat = 0 limit 1").fetchone()
    db.execute("update requests set repeat = 9 where case_id = ? and variant = ? and repeat = 0", [case, variant])
    db.conn.commit()
    want = db.execute("select min(id) from requests where case_id = ? and variant = ? and repeat = 1 and is_warmup = 0",
                      [case, variant]).fetchone()[0]
    db.close()
    with open_ledger(path, create=False) as led:
        assert want in led.first_answers(led.require_run(None)["id"])


def test_a_third_variant_never_enters_a_pair(shaped: Path, tmp_path: Path) -> None:
    """A candidate's pairs are its rows and the baseline's alone: a third variant that ran without
    alternation blocks leaves another candidate's block pairs as they are, in every command."""
    path = shaped_copy(shaped, tmp_path / "unblocked.db", ["update requests set order_block = null where variant = 'int4'"])
    whole, (_, got) = _both(path)
    mine = {e["paired_by"] for e in whole if e["variant"] == "w8a8" and e["metric"] == "e2e_mean"}
    theirs = {e["paired_by"] for e in whole if e["variant"] == "int4" and e["metric"] == "e2e_mean"}
    assert mine == {"block"}
    assert theirs == {"case"}
    assert same(got, whole)


def test_a_baseline_without_rows_leaves_its_margins_undecided(shaped: Path, tmp_path: Path) -> None:
    """No baseline row: each candidate's margins are still there, with no pairs (a gate counts them
    undecided, never passed), as the verdicts over every row have them; a sweep's levels need the
    baseline's, so a sweep has none."""
    path = shaped_copy(shaped, tmp_path / "no-base.db", ["delete from requests where variant = 'base'"])
    whole, (swept, got) = _both(path)
    assert same(got, whole)
    assert {(e["pairs"], e["verdict"]) for e in got} == (set() if swept else {(0, "inconclusive")})


def test_a_grader_read_through_its_margin_values_is_handed_its_grades(shaped: Path, monkeypatch) -> None:
    """A grader whose aggregate overrides `margin_values` alone declares no per-case values: the
    ledger hands it each side's grades of the pair, and its verdicts equal those over every row."""
    grader = available()["formality"]

    class Own(grader.aggregate):  # type: ignore[misc,name-defined]
        @classmethod
        def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
            return super().margin_values(grades, baseline_side)

    monkeypatch.setattr(grader, "aggregate", Own)
    assert _reads(parse_margins("formality_mae=0.2"))["grades"] == ["formality"]
    whole, (_, got) = _both(shaped)
    assert same(got, whole)
    assert all(e["pairs"] for e in got if e["metric"] == "formality_mae")


def _reports(path: Path) -> tuple[Any, Any]:
    """(the report's tables by definition: each row's quality columns from every grader's
    `summarise` over the slice's rows, the baseline's noise-floor passes counted; the report's
    tables from the ledger's queries), as JSON."""
    from evalkit.reporting.report import build_report, quality
    from evalkit.reporting.report import to_json as report_json

    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
        run = db.require_run(run_id)
        use_run(run)
        got = json.loads(report_json(build_report(db, run_id)))
        base = db.baseline(run_id)
        first = by_variant(first_level(request_rows(db, run_id)))
        base_cases = [r for r in first.get(base, []) if r["repeat"] < run.repeats]

        def side(variant: str, s: str) -> list[Any]:
            return [r for r in (base_cases if variant == base else first.get(variant, []))
                    if s == "all" or r["complexity"] == s]

        rows = [{**r, **quality(side(r["variant"], r["complexity"]),
                                None if r["variant"] == base else side(base, r["complexity"]))} for r in got["rows"]]
        floor = len(first.get(base, [])) - len(base_cases)
        return {"rows": json.loads(report_json({"rows": rows}))["rows"], "floor": floor, "baseline": base,
                "repeats": run.repeats}, got


def test_the_graders_summaries_the_ledger_computes_equal_their_summarise(shaped: Path) -> None:
    """Every built-in grader's quality columns, from the grades by `summarise` and from the ledger
    by the declared `summary_sql` where there is one (schema, persona, formality, judge) or from
    the per-case values of `summary_from_cases` (drift): the same tables, on grades of every
    grader, re-grades and failed grades."""
    whole, got = _reports(shaped)
    assert same(got["rows"], whole["rows"])


def test_the_noise_floor_passes_the_tables_leave_out_are_counted(shaped: Path) -> None:
    whole, got = _reports(shaped)
    assert [n for n in got["notes"] if "noise-floor pass(es)" in n] == \
        ([f"{whole['baseline']}: its {whole['floor']} noise-floor pass(es) (repeats past the run's {whole['repeats']}) "
          "are not in the tables: "
          "they are drift's floor, not cases"] if whole["floor"] else [])


def test_the_quality_table_has_every_declared_column(shaped: Path) -> None:
    _, got = _reports(shaped)
    row = next(r for r in got["rows"] if r["variant"] == "w8a8" and r["complexity"] == "all")
    assert [row[k] is not None for k in ("schema_pass_pct", "persona_score", "formality_mae", "judge_mean",
                                         "drift_minus_floor_ci95")] == [True] * 5


def test_the_grades_read_are_those_of_the_graders_that_declare_no_summary(shaped: Path, monkeypatch) -> None:
    """Drift declares its summary through per-case values: its grades are not read (divergence and
    accuracy declare neither)."""
    from evalkit.reporting import report

    seen: set[str] = set()
    real = report.request_rows
    monkeypatch.setattr(report, "request_rows", lambda *a, **k: seen.update(k.get("graders") or ()) or real(*a, **k))
    _reports(shaped)
    assert sorted(seen) == ["accuracy", "divergence"]


def test_no_row_is_read_when_every_grader_declares_its_summary(shaped: Path, tmp_path: Path, monkeypatch) -> None:
    from evalkit.reporting import report

    path = shaped_copy(shaped, tmp_path / "declared.db",
                       ["delete from grades where grader not in ('schema', 'persona', 'formality', 'judge', 'drift')"])
    monkeypatch.setattr(report, "request_rows", lambda *a, **k: pytest.fail("rows read"))
    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
        use_run(db.require_run(run_id))
        assert report.build_report(db, run_id)["rows"]


@pytest.mark.parametrize("shape", [
    "update grades set grader = 'gone' where grader = 'judge'",  # a grader the run recorded, not importable now
    "update grades set passed = 2 where grader in ('schema', 'persona') and passed = 1 and request_id % 5 = 0",
], ids=["unknown-grader", "passed-not-0-or-1"])
def test_the_ledger_s_summaries_hold_on_odd_grades(shaped: Path, tmp_path: Path, shape: str) -> None:
    """Grades of a grader that is no longer there stay unread (no columns, no error), and a pass
    stored as another number counts as `pass_pct` counts it (the sum of `passed`)."""
    whole, got = _reports(shaped_copy(shaped, tmp_path / "odd.db", [shape]))
    assert same(got["rows"], whole["rows"])


def test_a_summary_from_cases_that_is_no_dict_is_one_line(shaped: Path, monkeypatch) -> None:
    from evalkit.errors import PluginError

    monkeypatch.setattr(available()["drift"].aggregate, "summary_from_cases", classmethod(lambda cls, mine, base: [1]))
    with pytest.raises(PluginError, match="grader 'drift': its aggregate's hook `summary_from_cases` returned list"):
        _reports(shaped)
