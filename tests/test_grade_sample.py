"""Grading a stated, stratified sample: up to N cases per slice (level × complexity), every
variant's every repeat of each, the same choice whatever the row order, recorded and reported."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.grading import GradedRequest
from evalkit.grading.sample import GradeSample, sample_line, weights
from evalkit.reporting.verdicts import parse_margins, verdicts
from evalkit.spec.dataset import Case
from evalkit.testing.verdict_sim import strata_rows

COMPLEXITIES = {"short": 10, "medium": 6, "long": 2}  # cases per complexity


def _items() -> list[GradedRequest]:
    out, rid = [], 0
    for level in ("c=1", "c=8"):
        for cx, n in COMPLEXITIES.items():
            for k in range(n):
                case = Case.model_validate({"id": f"{cx}-{k}", "messages": [{"role": "user", "content": "hi"}],
                                            "complexity": cx})
                for variant in ("base", "cand"):
                    for repeat in (0, 1):
                        rid += 1
                        out.append(GradedRequest(rid, variant, "text", "stop", case, level, 1, repeat))
    return out


@pytest.fixture(scope="module")
def chosen() -> tuple[list[GradedRequest], dict]:
    return GradeSample(per_slice=3).choose(_items())


def _by_slice(items: list[GradedRequest]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for i in items:
        out[(i.level, i.case.complexity or "-")].add(i.case.id)
    return out


@pytest.mark.parametrize("level", ["c=1", "c=8"])
@pytest.mark.parametrize(("complexity", "kept"), [("short", 3), ("medium", 3), ("long", 2)])
def test_each_slice_keeps_up_to_n_cases_and_a_small_slice_whole(chosen, level, complexity, kept):
    assert len(_by_slice(chosen[0])[(level, complexity)]) == kept


def test_every_variant_and_repeat_of_a_kept_case_is_graded_so_pairs_stay_pairs(chosen):
    per_case = defaultdict(set)
    for i in chosen[0]:
        per_case[(i.level, i.case.id)].add((i.variant, i.repeat))
    assert all(v == {("base", 0), ("base", 1), ("cand", 0), ("cand", 1)} for v in per_case.values())


def test_the_choice_does_not_depend_on_the_order_rows_were_written(chosen):
    items = _items()
    random.Random(5).shuffle(items)
    again, _ = GradeSample(per_slice=3).choose(items)
    assert {i.request_id for i in again} == {i.request_id for i in chosen[0]}


def test_another_seed_chooses_other_cases(chosen):
    other, _ = GradeSample(per_slice=3, seed=1).choose(_items())
    assert {i.request_id for i in other} != {i.request_id for i in chosen[0]}


def test_the_record_counts_what_was_graded_of_what(chosen):
    info = chosen[1]
    assert (info["graded"], info["requests"], len(info["strata"])) == (len(chosen[0]), len(_items()), 6)


def test_the_stated_line_says_per_slice_counts_and_whole_slices(chosen):
    line = sample_line(chosen[1])
    assert "up to 3 cases per slice (level × complexity, seed 0)" in line
    assert f"{len(chosen[0]):,} of {len(_items()):,} successful requests graded" in line
    assert "2 of 6 slices graded whole" in line


def test_the_stated_line_gives_each_slice_s_weight(chosen):
    line = sample_line(chosen[1])
    assert "c=1/short 0.556 (3 of 10)" in line  # 10 of the level's 18 cases


def test_the_weights_of_a_level_sum_to_one(chosen):
    w = weights(chosen[1])
    assert sum(v for (level, _), v in w.items() if level == "c=8") == pytest.approx(1.0)


def test_a_weighted_sample_estimates_the_population_not_the_sample():
    """400 short cases that never lose, 40 long ones that lose 55 %: the population's difference is
    −5 pp; the sample (40 a slice) weighted to it says so, where its plain mean would say −27 pp."""
    (e,) = verdicts(strata_rows(-5.0, 3), "base", parse_margins({"schema_pass": "-5pp"}))
    assert -8.0 < e["estimate"] < -2.0


def test_no_sample_states_nothing():
    assert sample_line(None) is None


def test_a_sample_of_no_cases_is_refused():
    with pytest.raises(ValueError, match="at least one case"):
        GradeSample(per_slice=0)


def test_grade_sample_is_recorded_reported_and_a_full_grade_clears_it(runner, stub, endpoint_matrix, tmp_path):
    ledger = tmp_path / "l.db"
    m = endpoint_matrix(stub.base_url, stub.base_url, warmup=0)
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "12", "--ledger", str(ledger), "-q",
                            "--grader", "schema", "--grade-sample", "1"])
    assert r.exit_code == 0, r.output
    db = Database(ledger)
    run = next(db["runs"].rows)
    info = json.loads(run["grade_sample_json"])
    graded = db.execute("select count(*) from grades").fetchone()[0]
    assert graded == info["graded"] < info["requests"]
    rep = runner.invoke(cli, ["report", "--ledger", str(ledger)])
    assert "quality graded on a stratified sample: up to 1 cases per slice" in rep.output
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger), "--grader", "schema"])
    assert r.exit_code == 0, r.output
    assert f"{info['requests'] - info['graded']} new grades" in r.output
    assert db["runs"].get(run["id"])["grade_sample_json"] is None


def test_grade_sample_flag_is_checked(runner, tmp_path):
    r = runner.invoke(cli, ["grade", "--ledger", str(tmp_path / "none.db"), "--sample", "0"])
    assert r.exit_code == 2
    assert "--sample" in r.output
