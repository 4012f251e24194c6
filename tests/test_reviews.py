"""Human reviews (issue 35): the `reviews` table and its Ledger methods, the report's lines about
them (split, against the flips), and `publish` exporting them."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import cli
from evalkit.errors import UsageError
from evalkit.ledger import open_ledger
from evalkit.reporting.findings import findings
from evalkit.reporting.reviews import review_lines
from evalkit.sharing.compare import case_list, submit_review
from evalkit.sharing.publish import export
from tests.test_compare_view import build_ledger


def review(run_id: str = "r1", case: str = "c1", reviewer: str = "alice", verdict: str = "same", **kw) -> dict:
    return {"run_id": run_id, "case_id": case, "baseline": "base", "candidate": "w8a8", "baseline_request_id": 1,
            "candidate_request_id": 2, "reviewer": reviewer, "verdict": verdict, **kw}


def test_a_review_outside_the_four_verdicts_is_refused(db):
    with pytest.raises(UsageError):
        db.record_review(review(verdict="fine"))


def test_a_review_without_a_reviewer_is_refused(db):
    with pytest.raises(UsageError):
        db.record_review(review(reviewer=" "))


def test_a_refused_review_writes_nothing(db):
    with pytest.raises(UsageError):
        db.record_review(review(verdict="fine"))
    assert db.reviews("r1", latest=False) == []


def test_the_newest_review_of_a_reviewer_counts(db):
    db.record_review(review(verdict="same"))
    db.record_review(review(verdict="candidate_worse"))
    assert [r["verdict"] for r in db.reviews("r1")] == ["candidate_worse"]


def test_every_review_is_kept(db):
    db.record_review(review(verdict="same"))
    db.record_review(review(verdict="candidate_worse"))
    assert len(db.reviews("r1", latest=False)) == 2


def test_two_reviewers_of_one_pair_both_count(db):
    db.record_review(review(reviewer="alice"))
    db.record_review(review(reviewer="bob", verdict="both_fail"))
    assert sorted(r["reviewer"] for r in db.reviews("r1")) == ["alice", "bob"]


def test_a_review_keeps_its_comment(db):
    db.record_review(review(comment="  lost the greeting  "))
    assert db.reviews("r1")[0]["comment"] == "lost the greeting"


def test_a_review_is_timestamped(db):
    db.record_review(review())
    assert db.reviews("r1")[0]["created_at"].endswith("+00:00")


def test_no_reviews_no_report_lines():
    assert review_lines(None) == []


# --- on a run ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory):
    """A stub run with schema flips; alice reviews every flip as candidate worse and one pair
    without a flip as same."""
    ledger, run_id = build_ledger(tmp_path_factory.mktemp("reviewed"))
    db = open_ledger(ledger)
    pairs = case_list(db, run_id)["pairs"]
    flips = [p for p in pairs if p["flips"]]
    calm = next(p for p in pairs if not p["flips"])
    for p, verdict in [*((p, "candidate_worse") for p in flips), (calm, "same")]:
        submit_review(db, {"run": run_id, "case": p["case_id"], "candidate": p["candidate"], "verdict": verdict,
                           "baseline_request_id": p["baseline_request_id"],
                           "candidate_request_id": p["candidate_request_id"]}, "alice")
    return db, run_id, len(pairs), len(flips)


@pytest.mark.integration
def test_the_report_counts_the_reviewed_pairs(reviewed):
    db, run_id, n, k = reviewed
    assert findings(db, run_id)["reviews"]["reviewed_pairs"] == k + 1


@pytest.mark.integration
def test_the_report_counts_every_pair(reviewed):
    db, run_id, n, _ = reviewed
    assert findings(db, run_id)["reviews"]["pairs"] == n


@pytest.mark.integration
def test_the_report_splits_the_verdicts(reviewed):
    db, run_id, _, k = reviewed
    assert findings(db, run_id)["reviews"]["split"] == {"candidate_worse": k, "same": 1}


@pytest.mark.integration
def test_the_report_sets_the_verdicts_against_lost_passes(reviewed):
    db, run_id, _, k = reviewed
    assert findings(db, run_id)["reviews"]["against_flips"]["lost"] == {"candidate_worse": k}


@pytest.mark.integration
def test_the_report_sets_the_verdicts_against_no_flip(reviewed):
    db, run_id, _, _ = reviewed
    assert findings(db, run_id)["reviews"]["against_flips"]["no flip"] == {"same": 1}


@pytest.mark.integration
def test_the_report_says_how_many_were_reviewed(reviewed):
    db, run_id, n, k = reviewed
    assert f"reviews: {k + 1} of {n} pairs reviewed by 1 reviewer(s) (alice)" in "\n".join(findings(db, run_id)["notes"])


@pytest.mark.integration
def test_publish_exports_the_reviews(reviewed, tmp_path):
    db, run_id, _, k = reviewed
    assert export(db, tmp_path / "ds", run_id)["reviews"] == k + 1


@pytest.mark.integration
def test_the_report_gives_a_graders_kappa_against_the_reviews(reviewed):
    db, run_id, _, _ = reviewed  # alice called every schema flip worse and a pair without one the same
    assert findings(db, run_id)["reviews"]["agreement"]["schema"]["kappa"] == pytest.approx(1.0)


@pytest.mark.integration
def test_graders_calibrate_takes_a_ledgers_reviews(reviewed, runner):
    db, run_id, _, k = reviewed
    r = runner.invoke(cli, ["graders", "calibrate", "--grader", "schema", "--reviews", "--ledger", str(db.path), "--json"])
    assert json.loads(r.output)["confusion"]["candidate_worse"]["candidate_worse"] == k


@pytest.mark.integration
def test_graders_calibrate_without_reviews_says_how_to_make_them(stub_ledger, runner):
    r = runner.invoke(cli, ["graders", "calibrate", "--grader", "schema", "--reviews", "--ledger", str(stub_ledger)])
    assert "browse --review" in r.output


@pytest.mark.integration
def test_the_dataset_card_says_what_people_said(reviewed, tmp_path):
    db, run_id, n, k = reviewed
    export(db, tmp_path / "ds", run_id)
    card = (tmp_path / "ds" / "README.md").read_text(encoding="utf-8")
    assert f"- reviews: {k + 1} of {n} pairs reviewed" in card.split("## Human review", 1)[1]
