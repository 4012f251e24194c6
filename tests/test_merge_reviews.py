"""`evalkit ledger merge` carries people's reviews (issue 35): request ids follow the answers read,
a submission held by two inputs is one row, and the newest per reviewer still counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.ledger import copy_ledger, open_ledger
from evalkit.ledger.merge import merge_ledgers


def reviewed_ledger(path: Path, run_id: str, verdict: str = "candidate_worse") -> Path:
    """One run, one case answered by base and w8a8, and alice's review of that pair."""
    db = open_ledger(path)
    db._db["runs"].insert({"id": run_id, "status": "complete"}, alter=True)
    ids = []
    for variant in ("base", "w8a8"):
        ids.append(db.insert_request({"run_id": run_id, "variant": variant, "case_id": "c1", "repeat": 0,
                                      "level": None, "final": 1, "is_warmup": 0, "seq": len(ids) + 1,
                                      "text": f"{variant} answer"}))
    db.record_review({"run_id": run_id, "case_id": "c1", "baseline": "base", "candidate": "w8a8",
                      "baseline_request_id": ids[0], "candidate_request_id": ids[1], "reviewer": "alice",
                      "verdict": verdict, "comment": None})
    db.close()
    return path


def merged(tmp_path: Path, *sources: Path) -> tuple[dict, object]:
    counts = merge_ledgers(list(sources), tmp_path / "merged.db")
    return counts, open_ledger(tmp_path / "merged.db")


@pytest.fixture
def two_runs(tmp_path):
    return merged(tmp_path, reviewed_ledger(tmp_path / "a.db", "r-a"), reviewed_ledger(tmp_path / "b.db", "r-b"))


def test_merge_counts_the_reviews_of_both_inputs(two_runs):
    assert two_runs[0]["reviews"] == 2


@pytest.mark.parametrize("run_id", ["r-a", "r-b"])
def test_a_merged_review_names_the_answers_it_read(two_runs, run_id):
    _, db = two_runs
    r = db.reviews(run_id)[0]
    texts = {x["id"]: x["text"] for x in db._db.query("select id, text from requests where run_id = ?", [run_id])}
    assert (texts[r["baseline_request_id"]], texts[r["candidate_request_id"]]) == ("base answer", "w8a8 answer")


def test_a_review_held_by_two_inputs_is_one_row(tmp_path):
    a = reviewed_ledger(tmp_path / "a.db", "r-a")
    copy_ledger(a, tmp_path / "copy.db")
    _, db = merged(tmp_path, a, tmp_path / "copy.db")
    assert len(db.reviews("r-a", latest=False)) == 1


def test_the_copy_of_a_review_is_counted_as_dropped(tmp_path):
    a = reviewed_ledger(tmp_path / "a.db", "r-a")
    copy_ledger(a, tmp_path / "copy.db")
    counts, _ = merged(tmp_path, a, tmp_path / "copy.db")
    assert counts["reviews_duplicates_dropped"] == 1


def add_review(path: Path, verdict: str, created_at: str) -> None:
    db = open_ledger(path)
    first = db.reviews("r-a", latest=False)[0]
    db._db["reviews"].insert({**first, "id": None, "verdict": verdict, "created_at": created_at})
    db.close()


def test_the_newest_review_counts_whichever_input_holds_it(tmp_path):
    # after the copy, alice changed her mind in the copy and later again in the original; the
    # original is merged first, so input order alone would make the copy's older review the newest
    a = reviewed_ledger(tmp_path / "a.db", "r-a", verdict="same")
    copy_ledger(a, tmp_path / "copy.db")
    add_review(tmp_path / "copy.db", "candidate_worse", "2999-01-01T00:00:01.000+00:00")
    add_review(a, "both_fail", "2999-01-01T00:00:02.000+00:00")
    _, db = merged(tmp_path, a, tmp_path / "copy.db")
    assert [r["verdict"] for r in db.reviews("r-a")] == ["both_fail"]
