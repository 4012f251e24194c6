"""The report's known answers (issue 48, item 5; `tests/report_golden.py`): `report --json` of a
synthesized run in each shape and `report --html`, from the ledger's queries, equal the files the
report computed from every row in memory wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evalkit.grading.registry import use_run
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.reporting.findings import report_findings

from .report_golden import HTML_MARGINS, MARGINS, SHAPES, close, html_text, known, report_json, same_text, synth


@pytest.fixture(scope="module")
def synth_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("synth") / "synth.db"
    return path, synth().synthesize(path, 5000, ["base", "w8a8", "fp8"], [1, 4], seed=3)


def _shaped(synth_ledger: tuple[Path, dict[str, Any]], tmp_path: Path, shape: str) -> Any:
    path, _ = synth_ledger
    if shape == "plain":
        return open_ledger(path, create=False)
    db = open_ledger(copy_ledger(path, tmp_path / "shaped.db"), create=False)
    for sql in SHAPES[shape]:
        db._db.execute(sql)
    db._db.conn.commit()
    return db


@pytest.mark.parametrize(("shape", "margins"), [("plain", None), ("plain", MARGINS), *((s, None) for s in sorted(SHAPES))])
def test_the_json_report_is_its_known_answer(synth_ledger, tmp_path, shape, margins):
    db = _shaped(synth_ledger, tmp_path, shape)
    run_id = synth_ledger[1]["run_id"]
    use_run(db.require_run(run_id))
    got = report_json(*report_findings(db, run_id, margins=margins))
    db.close()
    assert close(got, known(f"report_{shape}{'_margins' if margins else ''}.json", got)) == []


@pytest.mark.parametrize("margins", [None, HTML_MARGINS])
def test_the_html_report_is_its_known_answer(synth_ledger, margins):
    from evalkit.reporting.html import render_html

    path, info = synth_ledger
    with open_ledger(path, create=False) as db:
        use_run(db.require_run(info["run_id"]))
        rep, fnd = report_findings(db, info["run_id"], margins=margins)
        got = html_text(render_html(db, info["run_id"], (rep, fnd)), rep)
    assert same_text(got, known(f"report_plain{'_margins' if margins else ''}.html", got)) == []


# The charts' other roads, written by the chart pass that read every row (at fd1a7dd; the
# formality scatter past 2,000 points re-written since: bands per level, not over jittered points): a run small
# enough that every point is drawn (CDF steps, box points, jittered scatters), and cases without
# the shipped complexity (one box a variant), small and large.
CHART_SHAPES = {"small": (300, []), "small_no_complexity": (300, ["update cases set complexity = 'any'"]),
                "plain_no_complexity": (5000, ["update cases set complexity = null"])}


@pytest.mark.parametrize("shape", sorted(CHART_SHAPES))
def test_the_html_report_of_each_chart_shape_is_its_known_answer(tmp_path, shape):
    from evalkit.reporting.html import render_html

    n, sqls = CHART_SHAPES[shape]
    info = synth().synthesize(tmp_path / "s.db", n, ["base", "w8a8", "fp8"], [1, 4], seed=5)
    with open_ledger(tmp_path / "s.db", create=False) as db:
        for sql in sqls:
            db._db.execute(sql)
        db._db.conn.commit()
        use_run(db.require_run(info["run_id"]))
        rep, fnd = report_findings(db, info["run_id"])
        got = html_text(render_html(db, info["run_id"], (rep, fnd)), rep)
    assert same_text(got, known(f"report_{shape}.html", got)) == []
