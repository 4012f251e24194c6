"""The A/A control, the position effect and the baseline's latency series read per case and per
group from the ledger (`Ledger.aa_cases`, `position_groups`, `series_shift`), never a row per
request: equal to their definitions over the requests themselves (the rows below, read as the
timeshare read them before), on a ledger shaped at the margins: alternation blocks and positions,
failed requests, a noise floor of three passes past the run's repeats, values of 0."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from evalkit.grading.margins import LATENCY
from evalkit.ledger import open_ledger
from evalkit.reporting.pairing import blocked, latency_pairs
from evalkit.reporting.timeshare import LEVEL, aa_control, position_effect
from evalkit.reporting.verdicts import parse_margins
from evalkit.stats import robust_mean, robust_ratio
from evalkit.stats.changepoint import mean_shift

from .report_golden import synth as _synth
from .test_ledger_verdicts import same
from .test_level_reads import shaped_copy

SHAPE = [
    "update requests set order_block = length(case_id) % 5, order_position = id % 3",
    "update requests set error_class = 'ReadTimeout', e2e_ms = null where id % 13 = 0",
    "update requests set e2e_ms = 0 where id % 29 = 0",  # no log: left out of the position effect
    "update runs set load_json = json_set(load_json, '$.repeats', 3)",  # repeats 3.. are the noise floor
]


@pytest.fixture(scope="module", params=["blocks", "cases"])
def floored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("timeshare") / "synth.db"
    _synth().synthesize(base, 2000, ["base", "w8a8"], [1], seed=5)
    shape = SHAPE if request.param == "blocks" else [*SHAPE, "update requests set order_block = id"]
    return shaped_copy(base, base.with_name(f"{request.param}.db"), shape)


def _requests(db: Any, run_id: str, field: str, variant: str | None = None) -> list[dict[str, Any]]:
    """Each successful final measured request of the first level: its value, in send order."""
    return [dict(r) for r in db._db.query(
        f"select variant, case_id, repeat, seq, order_block, order_position, [{field}] as value from measured "
        f"where run_id = :run and ok and coalesce(level, 'main') = :level and [{field}] is not null "
        "and (:variant is null or variant = :variant) order by seq",
        {"run": run_id, "level": db.first_level(run_id), "variant": variant})]


def _aa(rows: list[dict[str, Any]], repeats: int, metric: str, unit: str) -> dict[str, Any]:
    """The A/A control by its definition: the noise floor's requests against the measured ones."""
    sides = [{**r, "variant": "again" if r["repeat"] >= repeats else "main", "error_class": None} for r in rows]
    again, main, _ = latency_pairs(sides, "main", "again", "value", LATENCY[metric][1],
                                   blocks="sum" if unit == "%" else "mean")
    t = robust_ratio(again, main) if unit == "%" else robust_mean([x - y for x, y in zip(again, main, strict=True)])
    iv = t.interval(1 - LEVEL)
    return {"pairs": t.n, "estimate": t.estimate, "ci": list(iv) if iv else None,
            "paired_by": "block" if blocked(sides) else "case"}


@pytest.mark.parametrize("margin", ["e2e_mean=+5%", "tpot_mean=2ms"])
def test_the_aa_control_equals_its_definition(floored: Path, margin: str) -> None:
    specs = parse_margins(margin)
    with open_ledger(floored, create=False) as db:
        run = db.require_run(None)
        metric = specs[0].metric
        got = aa_control(db, run["id"], "base", run.repeats, metric, specs)
        want = _aa(_requests(db, run["id"], LATENCY[metric][0], "base"), run.repeats, metric, specs[0].unit)
    assert got is not None
    assert same({k: got[k] for k in want}, want)


def test_the_aa_control_has_pairs(floored: Path) -> None:
    with open_ledger(floored, create=False) as db:
        run = db.require_run(None)
        got = aa_control(db, run["id"], "base", run.repeats, "e2e_mean", parse_margins("e2e_mean=+5%"))
    assert got is not None and got["pairs"] >= 2
    assert got["paired_by"] == ("block" if floored.name == "blocks.db" else "case")


def test_no_noise_floor_has_no_aa_control(floored: Path) -> None:
    with open_ledger(floored, create=False) as db:
        run = db.require_run(None)
        assert aa_control(db, run["id"], "base", 1 << 20, "e2e_mean", parse_margins("e2e_mean=+5%")) is None


def test_the_position_effect_equals_its_definition(floored: Path) -> None:
    with open_ledger(floored, create=False) as db:
        run_id = db.require_run(None)["id"]
        got = position_effect(db, run_id)
        by: dict[int, dict[str, list[float]]] = {}
        for r in _requests(db, run_id, "e2e_ms"):
            if r["value"] > 0:
                g = by.setdefault(r["order_block"], {"first": [], "later": []})
                g["first" if r["order_position"] == 0 else "later"].append(math.log(r["value"]))
    diffs = [sum(g["later"]) / len(g["later"]) - sum(g["first"]) / len(g["first"])
             for g in by.values() if g["first"] and g["later"]]
    if floored.name == "cases.db":  # a request a group: none has a later request
        assert (got, len(diffs)) == (None, 0)
        return
    t = robust_mean(diffs)
    assert got is not None
    assert same([got["groups"], got["estimate_pct"]], [t.n, 100.0 * (math.exp(t.estimate) - 1.0)])


# the baseline's series shaped at the test's margins: a step, every value the same (no test), a
# value tied at the largest |S_k| (the first split wins), and too short a series to split
SERIES = {
    "as is": [],
    "stepped": ["update requests set e2e_ms = e2e_ms + 900 where seq > (select max(seq) / 2 from requests)"],
    "constant": ["update requests set e2e_ms = 250 where e2e_ms is not null"],
    "two values": ["update requests set e2e_ms = 100 + 50 * (seq % 2) where e2e_ms is not null"],
    "short": ["delete from requests where variant = 'base' and id > (select min(id) + 12 from requests)"],
}


@pytest.mark.parametrize("shape", SERIES)
def test_the_latency_change_point_test_sums_in_the_ledger_as_over_the_series(floored: Path, shape: str) -> None:
    path = shaped_copy(floored, floored.with_name(f"series-{shape.replace(' ', '-')}-{floored.name}"), SERIES[shape])
    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
        want = mean_shift([r["value"] for r in _requests(db, run_id, "e2e_ms", "base")])
        got = db.series_shift(run_id, "e2e_ms", "base")
    assert same(None if got is None else asdict(got), None if want is None else asdict(want))
