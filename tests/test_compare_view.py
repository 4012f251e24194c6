"""The comparison view (issue 35): a run's pairs by interest, filters and counts, one pair side by
side with its token heat, and the pages driven in headless Chromium, a review submitted included.
The ledger comes from two stub servers: the candidate's scoring is perturbed (a KL above zero at
every token) and every third answer of it is not JSON (schema flips)."""

from __future__ import annotations

import socket
import sqlite3
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
from click.testing import CliRunner

from evalkit.cli import cli
from evalkit.errors import UsageError
from evalkit.grading import GraderContext, grade_run, make_graders
from evalkit.ledger import open_ledger
from evalkit.reporting.flips import flips
from evalkit.sharing.browse import browse
from evalkit.sharing.compare import Filters, case_list, case_view, heat, submit_review, word_diff
from evalkit.sharing.compare_html import case_page
from evalkit.testing.cdp import Browser, chromium_path
from evalkit.testing.stub_server import StubConfig, StubServer

MATRIX = """name: compare-stubs
baseline: base
generation: {{warmup: 1, baseline_repeats: 2, structured_output: true, max_tokens: 64, temperature: 0}}
variants:
  - {{name: base, endpoint: '{a}'}}
  - {{name: w8a8, endpoint: '{b}'}}
"""


def fake_embed(texts: list[str]) -> np.ndarray:
    """Unit vectors from a hash of each text (no model to load): equal texts, equal vectors."""
    out = []
    for t in texts:
        v = np.random.default_rng(zlib.crc32(t.encode())).normal(size=16)
        out.append(v / np.linalg.norm(v))
    return np.array(out)


def build_ledger(tmp: Path, limit: int = 9) -> tuple[Path, str]:
    """A greedy run of base vs w8a8 on stubs, graded by divergence, schema and drift."""
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0, batch_noise=0.05)) as a, \
            StubServer(StubConfig(ttft_ms=4, itl_ms=0, logit_noise=0.4, numbered=True, fault="not_json",
                                  fault_every=3)) as b:
        m = tmp / "m.yaml"
        m.write_text(MATRIX.format(a=a.base_url, b=b.base_url), encoding="utf-8")
        ledger = tmp / "l.db"
        r = CliRunner().invoke(cli, ["run", "--matrix", str(m), "--limit", str(limit), "--ledger", str(ledger),
                                     "--no-grade", "-q"])
    assert r.exit_code == 0, r.output
    db = open_ledger(ledger)
    run_id = db.latest_run_id()
    grade_run(db, run_id, make_graders(["divergence", "schema", "drift"], GraderContext(embed=fake_embed)))
    db.close()
    return ledger, run_id


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, str]:
    return build_ledger(tmp_path_factory.mktemp("compare"))


def listing(compared: tuple[Path, str], **filters: object) -> dict:
    return case_list(open_ledger(compared[0]), compared[1], Filters(**filters))  # type: ignore[arg-type]


# --- the list: order, filters, counts ------------------------------------------------------------------------


@pytest.mark.integration
def test_the_run_has_flips_to_show(compared):
    assert listing(compared)["counts"]["flips"] > 0


@pytest.mark.integration
def test_flips_come_first(compared):
    has = [bool(p["flips"]) for p in listing(compared)["pairs"]]
    assert has == sorted(has, reverse=True)


@pytest.mark.integration
def test_after_the_flips_the_largest_kl_comes_first(compared):
    kls = [p["kl_mean"] for p in listing(compared)["pairs"] if not p["flips"]]
    assert kls == sorted(kls, reverse=True)


@pytest.mark.integration
def test_the_flip_count_matches_the_reports_flip_table(compared):
    with open_ledger(compared[0]) as db:
        table = flips(db, compared[1], db.baseline(compared[1]))
    schema = next(e for e in table if e["grader"] == "schema" and e["rule"] is None)
    assert listing(compared)["counts"]["flips"] == schema["gains"] + schema["losses"]


@pytest.mark.integration
def test_every_case_is_one_pair(compared):
    db = open_ledger(compared[0])
    cases = {r["case_id"] for r in db.measured_requests(compared[1], variant="w8a8")}
    assert listing(compared)["counts"]["pairs"] == len(cases)


@pytest.mark.integration
def test_flips_only_shows_only_flips(compared):
    assert all(p["flips"] for p in listing(compared, flips_only=True)["pairs"])


@pytest.mark.integration
def test_flips_only_shows_every_flip(compared):
    assert len(listing(compared, flips_only=True)["pairs"]) == listing(compared)["counts"]["flips"]


@pytest.mark.integration
def test_a_grader_result_filter_keeps_that_result(compared):
    shown = listing(compared, grader="schema", result="fail")["pairs"]
    assert shown and all(p["grades"]["schema"] is False for p in shown)


@pytest.mark.integration
def test_an_attribute_filter_keeps_that_value(compared):
    shown = listing(compared, attrs={"complexity": "short"})["pairs"]
    assert shown and all(p["attributes"]["complexity"] == "short" for p in shown)


@pytest.mark.integration
def test_filtered_counts_say_how_many_are_shown(compared):
    d = listing(compared, attrs={"complexity": "short"})
    assert d["counts"]["shown"] == len(d["pairs"]) < d["counts"]["pairs"]


def test_a_result_filter_other_than_pass_or_fail_is_refused():
    with pytest.raises(UsageError):
        Filters.from_query({"result": "maybe"})


# --- one pair ------------------------------------------------------------------------------------------------


def test_a_word_diff_joins_back_into_the_baseline_answer():
    a, b = "Dear Ana, thanks  for the call.", "Dear Ana, many thanks for your call!"
    assert "".join(x for _, x, _ in word_diff(a, b)) == a


def test_a_word_diff_joins_back_into_the_candidate_answer():
    a, b = "Dear Ana, thanks  for the call.", "Dear Ana, many thanks for your call!"
    assert "".join(y for _, _, y in word_diff(a, b)) == b


def test_identical_answers_diff_as_one_equal_run():
    assert [op for op, _, _ in word_diff("same words", "same words")] == ["equal"]


def test_heat_scales_each_token_by_the_answers_largest_kl():
    h = heat({"tokens": {"text": ["a", " b", " c"]}}, {"kl_tokens": [0.0, 0.2, 0.1], "first_top1_diff": 1})
    assert [t["shade"] for t in h] == [0.0, 1.0, 0.5]


def test_heat_marks_the_first_divergence():
    h = heat({"tokens": {"text": ["a", " b", " c"]}}, {"kl_tokens": [0.0, 0.2, 0.1], "first_diff_token": 2})
    assert [t["first"] for t in h] == [False, False, True]


def test_heat_is_empty_when_the_tokens_do_not_match_the_scores():
    assert heat({"tokens": {"text": ["a", " b"]}}, {"kl_tokens": [0.1]}) == []


@pytest.fixture(scope="module")
def top_case(compared) -> dict:
    first = listing(compared)["pairs"][0]
    return case_view(open_ledger(compared[0]), compared[1], first["case_id"], first["candidate"])


@pytest.mark.integration
def test_a_case_has_one_heat_value_per_scored_token(top_case):
    assert len(top_case["heat"]) == top_case["kl"]["n_tokens"]


@pytest.mark.integration
def test_the_heat_is_on_the_baselines_answer(top_case):
    assert "".join(t["text"] for t in top_case["heat"]) == top_case["base"]["text"]


@pytest.mark.integration
def test_a_case_marks_one_first_divergence(top_case):
    assert sum(t["first"] for t in top_case["heat"]) == 1


@pytest.mark.integration
def test_a_case_shows_both_sides_of_every_grader(top_case):
    assert {g["grader"] for g in top_case["verdicts"]} >= {"schema", "divergence", "drift"}


@pytest.mark.integration
def test_a_case_page_escapes_the_answers(top_case):
    evil = {**top_case, "cand": {**top_case["cand"], "text": "<script>alert(1)</script>"},
            "diff": word_diff(top_case["base"]["text"], "<script>alert(1)</script>")}
    assert "<script>alert" not in case_page(evil, "l", None)


@pytest.mark.integration
def test_a_read_only_case_page_has_no_review_form(top_case):
    assert "<form class='ek-review'" not in case_page(top_case, "l", None)


@pytest.mark.integration
def test_a_review_naming_another_cases_answer_is_refused(compared, top_case, tmp_path):
    other = next(p for p in listing(compared)["pairs"] if p["case_id"] != top_case["case_id"])
    form = {"run": compared[1], "case": top_case["case_id"], "candidate": "w8a8", "verdict": "same",
            "baseline_request_id": str(top_case["base"]["id"]), "candidate_request_id": str(other["candidate_request_id"])}
    with pytest.raises(UsageError):
        submit_review(open_ledger(copy_ledger(compared[0], tmp_path / "c.db")), form, "alice")


# --- in a real browser ---------------------------------------------------------------------------------------


def copy_ledger(src: Path, dst: Path) -> Path:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > end:
                raise
        time.sleep(0.3)


@pytest.fixture(scope="module")
def served(compared, tmp_path_factory):
    """`evalkit browse --review --reviewer alice` on a copy of the ledger (reviews land there)."""
    tmp = tmp_path_factory.mktemp("served")
    ledger = copy_ledger(compared[0], tmp / "review.db")
    port = free_port()
    p = browse(open_ledger(ledger), ledger, port=port, meta_dir=tmp, wait=False, reviewer="alice")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"{base}/-/compare")
        yield ledger, compared[1], base
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def chromium():
    assert chromium_path(), "headless Chromium is needed (make test installs Debian's chromium)"
    with Browser(width=1280, height=1000) as b:
        yield b


@pytest.mark.integration
def test_the_list_opens_in_chromium_with_the_most_interesting_pair_first(served, chromium):
    ledger, run_id, base = served
    chromium.open(f"{base}/-/compare?run={run_id}")
    first = chromium.eval("document.querySelector('tr.ek-pair td:nth-child(2)').textContent")
    assert first == case_list(open_ledger(ledger), run_id)["pairs"][0]["case_id"]


@pytest.mark.integration
def test_the_first_entry_in_chromium_is_a_flip(served, chromium):
    _, run_id, base = served
    chromium.open(f"{base}/-/compare?run={run_id}")
    assert chromium.eval("document.querySelector('tr.ek-pair .ek-flip') !== null")


@pytest.mark.integration
def test_the_list_counts_every_pair_in_chromium(served, chromium):
    ledger, run_id, base = served
    chromium.open(f"{base}/-/compare?run={run_id}")
    assert chromium.eval("document.querySelectorAll('tr.ek-pair').length") == \
        case_list(open_ledger(ledger), run_id)["counts"]["pairs"]


@pytest.mark.integration
def test_the_flips_filter_works_in_chromium(served, chromium):
    ledger, run_id, base = served
    chromium.open(f"{base}/-/compare?" + urlencode({"run": run_id, "flips": "1"}))
    assert chromium.eval("document.querySelectorAll('tr.ek-pair').length") == \
        case_list(open_ledger(ledger), run_id)["counts"]["flips"]


def open_first_case(chromium: Browser, base: str, run_id: str) -> None:
    chromium.open(f"{base}/-/compare?run={run_id}")
    chromium.submit("document.querySelector('tr.ek-pair a').click()")


@pytest.mark.integration
def test_a_case_shows_the_baselines_answer_in_chromium(served, chromium, top_case):
    _, run_id, base = served
    open_first_case(chromium, base, run_id)
    assert chromium.eval("document.querySelector('.ek-base').textContent") == top_case["base"]["text"]


@pytest.mark.integration
def test_a_case_shows_the_candidates_answer_in_chromium(served, chromium, top_case):
    _, run_id, base = served
    open_first_case(chromium, base, run_id)
    assert chromium.eval("document.querySelector('.ek-cand').textContent") == top_case["cand"]["text"]


@pytest.mark.integration
def test_a_case_shades_tokens_in_chromium(served, chromium):
    _, run_id, base = served
    open_first_case(chromium, base, run_id)
    shaded = chromium.eval("Array.from(document.querySelectorAll('.ek-tok')).filter(e => "
                           "getComputedStyle(e).backgroundColor !== 'rgba(0, 0, 0, 0)').length")
    assert shaded >= 1


@pytest.mark.integration
def test_a_review_submitted_in_chromium_is_a_reviews_row(served, chromium, top_case):
    ledger, run_id, base = served
    open_first_case(chromium, base, run_id)
    chromium.submit("document.querySelector(\"input[value='candidate_worse']\").click();"
                    "document.querySelector('textarea[name=comment]').value = 'lost the JSON';"
                    "document.querySelector('form.ek-review input[type=submit]').click()")
    rows = open_ledger(ledger).reviews(run_id)
    assert [(r["reviewer"], r["case_id"], r["verdict"], r["comment"]) for r in rows] == \
        [("alice", top_case["case_id"], "candidate_worse", "lost the JSON")]


@pytest.mark.integration
def test_the_page_says_the_review_was_saved(served, chromium):
    _, run_id, base = served
    open_first_case(chromium, base, run_id)
    chromium.submit("document.querySelector(\"input[value='same']\").click();"
                    "document.querySelector('form.ek-review input[type=submit]').click()")
    assert "saved review" in chromium.eval("document.querySelector('.ek-saved').textContent")


@pytest.mark.integration
def test_browse_review_needs_a_reviewer(runner, compared):
    r = runner.invoke(cli, ["browse", "--ledger", str(compared[0]), "--review"])
    assert r.exit_code == 2


def plugin_module():
    import importlib.util

    from evalkit.sharing.browse import PLUGINS

    spec = importlib.util.spec_from_file_location("evalkit_compare_plugin", PLUGINS / "evalkit_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeDatasette:
    def __init__(self, review: bool) -> None:
        self.review = review

    def plugin_config(self, name: str) -> dict:
        return {"ledger": "unused.db", "db": "l", "review": self.review, "reviewer": "alice" if self.review else None}


class FakeRequest:
    method = "POST"

    async def post_vars(self) -> dict:
        raise AssertionError("a read-only server never reads the form")


def test_a_read_only_server_refuses_a_posted_review():
    import asyncio

    r = asyncio.run(plugin_module().compare_review(FakeRequest(), FakeDatasette(review=False)))
    assert r.status == 403
