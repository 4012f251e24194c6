"""Human reviews (issue 35): the `reviews` table and its Ledger methods, the report's lines about
them (split, against the flips), and `publish` exporting them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.errors import UsageError
from evalkit.grading import grade_run, make_graders, registry
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


# --- a plugin grader against the reviews (issue 46) ---------------------------------------------------------

TRIAGE = """from evalkit.grading import GradedRequest, Grader, Score


class Triage(Grader):
    name = "triage"
    version = "1"
    default = False

    def grade(self, item: GradedRequest) -> Score:
        return Score(float(len(item.text)), len(item.text) % 2 == 0, "even length")
"""


def forget_triage() -> None:
    """What a new process would not know: the plugin's module and its folder on the import path."""
    for d in (registry._LOCAL, registry._ROOTS, registry._ORIGIN):
        d.pop("triage", None)
    sys.modules.pop("triage_mod", None)
    registry.UNRESOLVED.clear()
    sys.path[:] = [p for p in sys.path if "triage-workload" not in p]
    registry.available.cache_clear()


@pytest.fixture(scope="module")
def triaged(tmp_path_factory):
    """A reviewed stub run graded by a module:Class grader from a workload folder, the run not
    recording it (graded from Python): (ledger, run id, the folder)."""
    tmp = tmp_path_factory.mktemp("triaged")
    ledger, run_id = build_ledger(tmp)
    folder = tmp / "triage-workload"
    folder.mkdir()
    (folder / "triage_mod.py").write_text(TRIAGE, encoding="utf-8")
    (folder / "matrix.yaml").write_text("name: triage\nbaseline: a\nvariants: [{name: a, endpoint: http://x}]\n",
                                        encoding="utf-8")
    db = open_ledger(ledger)
    for p in case_list(db, run_id)["pairs"]:
        submit_review(db, {"run": run_id, "case": p["case_id"], "candidate": p["candidate"],
                           "verdict": "candidate_worse" if p["flips"] else "same",
                           "baseline_request_id": p["baseline_request_id"],
                           "candidate_request_id": p["candidate_request_id"]}, "alice")
    registry.add_path(folder)
    registry.register("triage_mod:Triage")
    grade_run(db, run_id, make_graders(["triage"]))
    db.close()
    forget_triage()
    return ledger, run_id, folder


@pytest.fixture
def forgets_triage():
    forget_triage()
    yield
    forget_triage()


def _copy_ledger(src: Path, dst: Path) -> Path:
    from evalkit.ledger import copy_ledger

    return copy_ledger(src, dst)  # the backup API: a byte copy of a live ledger drops its locks


@pytest.mark.integration
@pytest.mark.parametrize("how", ["grader-path", "module:Class", "workload folder", "recorded on the run"])
def test_graders_calibrate_finds_a_plugin_grader(triaged, runner, tmp_path, monkeypatch, forgets_triage, how):
    ledger, run_id, folder = triaged
    args = ["graders", "calibrate", "--grader", "triage", "--reviews", "--ledger", str(ledger)]
    monkeypatch.chdir(tmp_path)
    if how == "grader-path":
        args += ["--grader-path", str(folder)]
    elif how == "module:Class":
        args = [*args[:3], "triage_mod:Triage", *args[4:], "--grader-path", str(folder)]
    elif how == "workload folder":
        monkeypatch.chdir(folder)
    else:  # `evalkit grade --grader mod:Class` recorded it on (a copy of) the run
        ledger = _copy_ledger(ledger, tmp_path / "copy.db")
        args[args.index("--ledger") + 1] = str(ledger)
        db = open_ledger(ledger)
        registry.add_path(folder)
        registry.record(db, run_id, [registry.register("triage_mod:Triage")])
        db.close()
        forget_triage()
    r = runner.invoke(cli, args)
    assert "triage vs people (reviewed pairs): kappa" in r.output, r.output


@pytest.mark.integration
def test_graders_calibrate_names_how_to_find_an_unknown_grader(triaged, runner, tmp_path, monkeypatch, forgets_triage):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(cli, ["graders", "calibrate", "--grader", "triage", "--reviews", "--ledger", str(triaged[0])])
    assert "--grader-path" in r.output
