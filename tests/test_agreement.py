"""Graders against people (issue 35): Cohen's kappa with its interval and confusion matrix
(stats/agreement.py), any pass/fail grader against a labelled file or a ledger's reviews
(grading/calibrate_labels.py), the LLM judge on the shipped labels, and the CLI."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import cli
from evalkit.errors import UsageError
from evalkit.grading.calibrate_labels import against_file, against_reviews, pair_category, read_labels
from evalkit.paths import rubrics_dir
from evalkit.stats.agreement import cohen_kappa
from evalkit.testing.stub_server import StubConfig, StubServer


def table(counts: dict[tuple[str, str], int]) -> tuple[list[str], list[str]]:
    a, b = [], []
    for (x, y), n in counts.items():
        a += [x] * n
        b += [y] * n
    return a, b


def test_kappa_of_a_two_by_two_table_is_agreement_beyond_chance():
    # p_o = 35/50 = 0.7; p_e = (25·30 + 25·20) / 50² = 0.5; kappa = (0.7 − 0.5) / 0.5
    a, b = table({("y", "y"): 20, ("y", "n"): 5, ("n", "y"): 10, ("n", "n"): 15})
    assert cohen_kappa(a, b)["kappa"] == pytest.approx(0.4)


def test_perfect_agreement_has_kappa_one():
    assert cohen_kappa(["a", "b", "a", "c"], ["a", "b", "a", "c"])["kappa"] == pytest.approx(1.0)


def test_the_interval_holds_the_estimate():
    a, b = table({("y", "y"): 20, ("y", "n"): 5, ("n", "y"): 10, ("n", "n"): 15})
    r = cohen_kappa(a, b)
    assert r["ci95"][0] <= r["kappa"] <= r["ci95"][1]


def test_the_interval_is_reproducible():
    a, b = table({("y", "y"): 12, ("y", "n"): 4, ("n", "y"): 3, ("n", "n"): 9})
    assert cohen_kappa(a, b)["ci95"] == cohen_kappa(a, b)["ci95"]


def test_a_rater_that_never_varies_agrees_at_chance():
    a, b = table({("pass", "pass"): 6, ("pass", "fail"): 4})
    assert cohen_kappa(a, b)["kappa"] == pytest.approx(0.0)


def test_kappa_is_undefined_when_both_raters_never_vary():
    assert cohen_kappa(["pass"] * 5, ["pass"] * 5)["kappa"] is None


def test_the_confusion_matrix_counts_each_cell():
    a, b = table({("y", "y"): 20, ("y", "n"): 5, ("n", "y"): 10, ("n", "n"): 15})
    assert cohen_kappa(a, b)["confusion"]["n"]["y"] == 10


def test_a_graders_pair_category_follows_its_two_verdicts():
    assert [pair_category(b, c) for b, c in ((True, True), (False, True), (True, False), (False, False))] == \
        ["same", "candidate_better", "candidate_worse", "both_fail"]


def grade(passed: bool, **rules: bool) -> dict:
    return {"passed": passed, "detail": {"rules": {k: {"passed": v} for k, v in rules.items()}}}


def test_reviews_are_matched_to_the_graders_verdicts_on_both_answers():
    reviews = [{"baseline_request_id": 1, "candidate_request_id": 2, "verdict": "candidate_worse"},
               {"baseline_request_id": 3, "candidate_request_id": 4, "verdict": "same"}]
    grades = {1: {"g": grade(True)}, 2: {"g": grade(False)}, 3: {"g": grade(True)}, 4: {"g": grade(True)}}
    assert against_reviews("g", reviews, grades)["kappa"] == pytest.approx(1.0)


def test_reviews_are_matched_per_rule():
    reviews = [{"baseline_request_id": 1, "candidate_request_id": 2, "verdict": "candidate_worse"},
               {"baseline_request_id": 3, "candidate_request_id": 4, "verdict": "same"}]
    grades = {1: {"g": grade(True, tone=True)}, 2: {"g": grade(False, tone=True)},
              3: {"g": grade(True, tone=True)}, 4: {"g": grade(True, tone=True)}}
    assert against_reviews("g", reviews, grades)["rules"]["tone"]["confusion"]["same"]["candidate_worse"] == 1


def test_a_review_of_an_ungraded_pair_is_left_out_and_counted():
    reviews = [{"baseline_request_id": 1, "candidate_request_id": 9, "verdict": "same"}]
    assert against_reviews("g", reviews, {1: {"g": grade(True)}})["unmatched"] == 1


# --- labelled files ------------------------------------------------------------------------------------------


def test_the_shipped_judge_labels_are_what_their_builder_makes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("judge_labels", rubrics_dir() / "judge_labels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (rubrics_dir() / "judge_labels.jsonl").read_text(encoding="utf-8") == mod.build()


def test_the_shipped_judge_labels_have_both_outcomes():
    assert {r["passed"] for r in read_labels(rubrics_dir() / "judge_labels.jsonl")} == {True, False}


def test_a_labelled_line_without_passed_names_its_line(tmp_path):
    p = tmp_path / "l.jsonl"
    p.write_text(json.dumps({"case_id": "x", "text": "t", "passed": True}) + "\n" + json.dumps({"case_id": "x"}) + "\n")
    with pytest.raises(UsageError, match=r"l.jsonl:2"):
        read_labels(p)


def schema_labels(tmp_path, shipped_rows) -> tuple:
    """Valid and invalid JSON answers to a case with a schema, labelled as people would."""
    case = next(r for r in shipped_rows if r.get("schema") == "outreach_email")
    body = "A short note about the backend role on your team and why my work fits it well."
    good = json.dumps({"subject": "Hello", "body": body, "sign_off": "Best, Ana"})
    rows = [{"case_id": case["id"], "text": good, "passed": True}, {"case_id": case["id"], "text": "not json", "passed": False},
            {"case_id": case["id"], "text": good, "passed": True}, {"case_id": case["id"], "text": "{}", "passed": False}]
    p = tmp_path / "schema_labels.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def test_a_pass_fail_grader_is_calibrated_on_a_labelled_file(tmp_path, shipped_rows):
    assert against_file("schema", schema_labels(tmp_path, shipped_rows))["kappa"] == pytest.approx(1.0)


def test_a_grader_of_whole_runs_is_refused_a_labelled_file(tmp_path, shipped_rows):
    with pytest.raises(UsageError):
        against_file("drift", schema_labels(tmp_path, shipped_rows))


@pytest.mark.integration
def test_the_judge_is_calibrated_on_the_shipped_labels(runner):
    # a judge that always answers 4 passes everything: it agrees with people only by chance
    with StubServer(StubConfig(fixed_text="Score: 4\nIt reads well.", ttft_ms=0, itl_ms=0)) as s:
        r = runner.invoke(cli, ["graders", "calibrate", "--grader", "judge", "--judge-endpoint", s.base_url,
                                "--judge-model", "stub-model", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["kappa"] == pytest.approx(0.0)


@pytest.mark.integration
def test_the_judges_calibration_prints_kappa_with_an_interval(runner):
    with StubServer(StubConfig(fixed_text="Score: 4", ttft_ms=0, itl_ms=0)) as s:
        r = runner.invoke(cli, ["graders", "calibrate", "--grader", "judge", "--judge-endpoint", s.base_url,
                                "--judge-model", "stub-model"])
    assert "judge vs people (labelled texts in" in r.output and "kappa +0.00 [" in r.output


@pytest.mark.integration
def test_the_judge_without_a_server_is_a_usage_error(runner):
    assert runner.invoke(cli, ["graders", "calibrate", "--grader", "judge"]).exit_code == 2
