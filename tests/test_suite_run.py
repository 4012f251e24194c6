"""Task accuracy, paired, through a whole run (issue 49): a GSM8K-format file written here, two
answering endpoints of known accuracy (each "What is A + B?" answered right when a seeded hash of
the question says so, `stub_text.answer_sum`), and a candidate that reasons before it answers.
Every item's grade is known before the run; the report must give exactly those counts."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from evalkit.cli import cli
from evalkit.testing.stub_server import StubConfig, StubServer
from evalkit.testing.stub_text import answer_sum

pytestmark = pytest.mark.integration
ACCURACY = {"base": (0.9, 0), "cand": (0.7, 3)}  # (share answered right, seed)


def questions(n: int = 30) -> list[tuple[str, int]]:
    rng = random.Random(7)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 500), rng.randint(1, 500)
        out.append((f"Sam has {a} apples and buys some more. What is {a} + {b}?", a + b))
    return out


def right(variant: str) -> dict[str, bool]:
    acc, seed = ACCURACY[variant]
    return {q: answer_sum(q, acc, seed).endswith(f"#### {total}") for q, total in questions()}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("suite")
    data = tmp / "gsm8k_test.jsonl"  # the published layout: question, and an answer ending "#### N"
    data.write_text("".join(json.dumps({"question": q, "answer": f"Add them.\n#### {t}"}) + "\n" for q, t in questions()))
    (base_acc, base_seed), (cand_acc, cand_seed) = ACCURACY["base"], ACCURACY["cand"]
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1, sum_accuracy=base_acc, seed=base_seed)) as a, \
            StubServer(StubConfig(ttft_ms=2, itl_ms=4, sum_accuracy=cand_acc, seed=cand_seed, reasoning_chunks=5,
                                  reasoning_field="reasoning")) as b:
        m = tmp / "m.yaml"
        m.write_text(f"name: acc\nbaseline: base\nmargins: {{'accuracy:gsm8k': -5pp}}\ngeneration:\n  warmup: 0\n"
                     f"  max_tokens: 32\nvariants:\n  - name: base\n    endpoint: {a.base_url}\n"
                     f"  - name: cand\n    endpoint: {b.base_url}\n")
        ledger = tmp / "l.db"
        r = CliRunner().invoke(cli, ["run", "--matrix", str(m), "--suite", f"gsm8k:{data}", "--ledger", str(ledger),
                                     "-q"])
        assert r.exit_code == 0, r.output
    rep = CliRunner().invoke(cli, ["report", "--ledger", str(ledger), "--json"])
    assert rep.exit_code == 0, rep.output
    return json.loads(rep.output), ledger


def entry(rep: dict, variant: str) -> dict:
    return next(e for e in rep["findings"]["accuracy"] if e["variant"] == variant and e["suite"] == "gsm8k")


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_every_item_is_graded_exactly(suite_run, variant):
    assert entry(suite_run[0], variant)["right"] == sum(right(variant).values())


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_wrong_counts_are_the_rest(suite_run, variant):
    assert entry(suite_run[0], variant)["wrong"] == 30 - sum(right(variant).values())


def test_lost_items_are_the_ones_only_the_baseline_got_right(suite_run):
    b, c = right("base"), right("cand")
    assert entry(suite_run[0], "cand")["lost"] == sum(1 for q in b if b[q] and not c[q])


def test_gained_items_are_the_ones_only_the_candidate_got_right(suite_run):
    b, c = right("base"), right("cand")
    assert entry(suite_run[0], "cand")["gained"] == sum(1 for q in b if c[q] and not b[q])


def test_recovery_is_the_ratio_of_accuracies(suite_run):
    want = 100.0 * sum(right("cand").values()) / sum(right("base").values())
    assert entry(suite_run[0], "cand")["recovery_pct"] == pytest.approx(want)


def test_recovery_has_a_paired_interval_around_it(suite_run):
    e = entry(suite_run[0], "cand")
    assert e["recovery_ci"][0] <= e["recovery_pct"] <= e["recovery_ci"][1]


def test_the_suite_margin_gets_a_verdict(suite_run):
    assert [v["metric"] for v in suite_run[0]["findings"]["verdicts"]] == ["accuracy:gsm8k"]


def test_the_reasoning_variant_has_its_reasoning_time(suite_run):
    with sqlite3.connect(suite_run[1]) as c:
        rows = c.execute("select ttfo_ms - ttft_ms, reasoning_ms from requests where variant = 'cand' and "
                         "is_warmup = 0").fetchall()
    assert all(abs(d - r) < 1e-6 for d, r in rows)


def test_the_reasoning_variant_counts_its_reasoning_tokens(suite_run):
    with sqlite3.connect(suite_run[1]) as c:
        counts = {r[0] for r in c.execute("select reasoning_tokens from requests where variant = 'cand' and "
                                          "is_warmup = 0")}
    assert counts == {5}


@pytest.mark.parametrize("column", ["reasoning_tokens", "reasoning_ms"])
def test_a_variant_that_does_not_reason_has_no_reasoning_figures(suite_run, column):
    with sqlite3.connect(suite_run[1]) as c:
        got = c.execute(f"select count({column}) from requests where variant = 'base'").fetchone()[0]
    assert got == 0


def test_graders_read_the_answer_without_its_reasoning(suite_run):
    # the candidate's reasoning ("step 0. ...") holds numbers; its answer's `#### N` is what is graded
    assert entry(suite_run[0], "cand")["unparsed"] == 0


@pytest.fixture(scope="module")
def choice_run(tmp_path_factory):
    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("choice")
    with StubServer(StubConfig(ttft_ms=1, itl_ms=0)) as a, StubServer(StubConfig(ttft_ms=1, itl_ms=0)) as b:
        m = tmp / "m.yaml"
        m.write_text(f"name: mc\nbaseline: base\ngeneration:\n  warmup: 0\n  max_tokens: 16\n"
                     "divergence: {enabled: false}\n"
                     f"variants:\n  - name: base\n    endpoint: {a.base_url}\n  - name: cand\n    endpoint: {b.base_url}\n")
        ledger = tmp / "l.db"
        r = CliRunner().invoke(cli, ["run", "--matrix", str(m), "--suite", "choice", "--limit", "8", "--ledger",
                                     str(ledger), "-q"])
        assert r.exit_code == 0, r.output
    rep = CliRunner().invoke(cli, ["report", "--ledger", str(ledger), "--json"])
    return json.loads(rep.output), ledger


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_each_option_of_each_choice_item_is_scored_teacher_forced(choice_run, variant):
    with sqlite3.connect(choice_run[1]) as c:
        n = c.execute("select count(*) from token_scores where kind like 'choice:%' and status = 'ok' and variant = ?",
                      [variant]).fetchone()[0]
    assert n == 8 * 4


@pytest.mark.parametrize("rule", ["acc", "acc_norm"])
def test_choice_accuracy_by_log_likelihood_is_reported_per_rule(choice_run, rule):
    got = [e for e in choice_run[0]["findings"]["accuracy"] if e["suite"] == f"choice ({rule}, log-likelihood)"]
    assert sorted(e["variant"] for e in got) == ["base", "cand"]


def test_the_same_scorer_twice_loses_and_gains_nothing(choice_run):
    e = next(e for e in choice_run[0]["findings"]["accuracy"]
             if e["suite"] == "choice (acc, log-likelihood)" and e["variant"] == "cand")
    assert (e["lost"], e["gained"]) == (0, 0)


def test_plan_says_what_drop_the_suites_items_can_detect(suite_run):
    # the minimum detectable difference before the next run (issue 49): McNemar, from the pilot's discordance
    from evalkit.ledger import open_ledger
    from evalkit.reporting.plan import plan, plan_lines

    with open_ledger(suite_run[1], create=False) as led:
        lines = plan_lines(plan(led, None, {}, cases=200))
    assert any(x.startswith("accuracy gsm8k (cand): 200 items can detect a drop of") for x in lines), lines
