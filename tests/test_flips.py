"""Flips (issue 26): the share of cases whose pass/fail changed between the baseline and a
candidate, either way. The flip rate is one proportion with an exact binomial test that inverts
into its Clopper-Pearson interval; a flips margin takes part in the verdicts like the others,
keeps its stated 5 % error at the margin (exactly enumerated, and in a seeded simulation), and its
printed interval never disagrees with its verdict."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from scipy.stats import binom, binomtest
from sqlite_utils import Database

from evalkit.ledger import copy_ledger, open_ledger
from evalkit.reporting import flips
from evalkit.reporting.verdicts import hypotheses, parse_margins, verdicts
from evalkit.stats.binomial import FlipRate, cases_to_show_below
from evalkit.testing.verdict_sim import _row

from .report_golden import synth as _synth

WRONG_AT_MARGIN = {"non-inferior", "superior", "inferior"}


def flip_rows(n: int, flipped: list[bool], rule_flips: list[bool] | None = None) -> list[dict]:
    """n cases; case i flips (baseline passes, candidate fails, or the other way every other case)."""
    out = []
    for i in range(n):
        b = i % 2 == 0
        c = (not b) if flipped[i] else b
        rb = True
        rc = not rb if rule_flips and rule_flips[i] else rb
        grade = {"detail": {"rules": {"mentions_company": {"passed": rb}}}}
        out += [_row("base", i, grades={"schema": {"value": float(b), "passed": int(b), "detail": {}},
                                        "persona": {"value": 1.0, "passed": int(b), **grade}}),
                _row("cand", i, grades={"schema": {"value": float(c), "passed": int(c), "detail": {}},
                                        "persona": {"value": 1.0, "passed": int(c),
                                                    "detail": {"rules": {"mentions_company": {"passed": rc}}}}})]
    return out


@pytest.mark.parametrize("k,n", [(0, 12), (1, 12), (5, 24), (24, 24), (3, 48)])
def test_the_interval_is_clopper_pearson(k, n):
    lo, hi = FlipRate(k, n).interval(0.05)
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (lo, hi) == pytest.approx((100 * ref.low, 100 * ref.high), abs=1e-6)


@pytest.mark.parametrize("k,n", [(1, 12), (5, 24), (23, 24), (3, 48), (40, 1000), (366, 1000)])
@pytest.mark.parametrize("delta", [0.0, 0.5, 5.0, 36.6, 50.0, 100.0])
def test_the_tails_are_the_binomial_s(k, n, delta):
    """The one-sided p-values (scipy.special's incomplete beta, not scipy.stats) are the binomial tails."""
    t, p = FlipRate(k, n), delta / 100
    assert (t.p_greater(delta), t.p_less(delta)) == pytest.approx((binom.sf(k - 1, n, p), binom.cdf(k, n, p)),
                                                                   rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("n", [12, 24, 48])
@pytest.mark.parametrize("level", [0.05, 0.0125])
def test_the_test_rejects_exactly_outside_its_interval(n, level):
    for k in range(n + 1):
        t = FlipRate(k, n)
        lo, hi = t.interval(level)
        for d in (0.5, 2.0, 5.0, 10.0, 25.0, 60.0):
            assert (t.p(d) <= level) == (not lo <= d <= hi), (k, n, d)


@pytest.mark.parametrize("n", [12, 24, 48, 96])
@pytest.mark.parametrize("margin", [5.0, 10.0])
def test_wrong_verdicts_at_the_margin_stay_within_5_percent_exactly(n, margin):
    """The true flip rate is the margin: every outcome k ~ Binomial(n, margin) through the real
    verdict code, weighted by its probability. Any verdict but inconclusive is wrong."""
    spec = parse_margins({"schema_flips": f"{margin:g}pp"})
    wrong = 0.0
    for k in range(n + 1):
        v = verdicts(flip_rows(n, [i < k for i in range(n)]), "base", spec)[0]["verdict"]
        wrong += binom.pmf(k, n, margin / 100) * (v in WRONG_AT_MARGIN)
    assert wrong <= 0.05


@pytest.mark.parametrize("n", [24, 96])
def test_a_seeded_simulation_at_the_margin_finds_no_excess_error(n):
    spec = parse_margins({"flips_max": "10pp"})  # both pass/fail graders' flips: two hypotheses, one Holm family
    rng = random.Random(26 + n)
    sims = 300
    wrong = 0
    for _ in range(sims):
        vs = verdicts(flip_rows(n, [rng.random() < 0.10 for _ in range(n)]), "base", spec)
        wrong += any(e["verdict"] in WRONG_AT_MARGIN for e in vs)
    assert binom.sf(wrong - 1, sims, 0.05) > 1e-3, f"{wrong} of {sims} runs had a wrong verdict"


def test_a_rate_well_below_the_margin_is_non_inferior_with_enough_cases():
    spec = parse_margins({"schema_flips": "10pp"})
    (e,) = verdicts(flip_rows(200, [i < 2 for i in range(200)]), "base", spec)
    assert e["verdict"] == "non-inferior"


def test_many_flips_are_inferior_even_when_the_pass_rates_agree():
    """Half the cases flip, gains and losses cancel: the net change is 0, the flip rate is not."""
    rows = flip_rows(24, [True] * 24)
    (e,) = verdicts(rows, "base", parse_margins({"schema_flips": "5pp"}))
    (net,) = verdicts(rows, "base", parse_margins({"schema_pass": "-10pp"}))
    assert (e["verdict"], net["estimate"]) == ("inferior", 0.0)


def test_printed_interval_agrees_with_the_verdict():
    spec = parse_margins({"schema_flips": "5pp"})
    for k in range(0, 25, 3):
        (e,) = verdicts(flip_rows(24, [i < k for i in range(24)]), "base", spec)
        lo, hi = e["ci"]
        expect = "inferior" if lo > 5 else "non-inferior" if hi < 5 else "inconclusive"
        assert e["verdict"] == expect, (k, e)


def test_flips_max_expands_to_every_pass_fail_grader():
    assert [m.metric for m in parse_margins("flips_max=5pp")] == ["schema_flips", "persona_flips", "accuracy_flips"]


def test_a_flips_margin_is_one_hypothesis():
    assert hypotheses(parse_margins("schema_flips=5pp,schema_pass=-10pp")) == 3


def test_a_flips_margin_is_worsening_upwards():
    (m,) = parse_margins("schema_flips=5pp")
    assert (m.value, m.unit, m.higher_is_better) == (5.0, "pp", False)


@pytest.fixture(scope="module")
def two_variants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flips") / "plain.db"
    _synth().synthesize(path, 288, ["base", "w8a8"], [1], seed=1)
    return path


def _table(plain: Path, tmp_path: Path, flipped: list[bool], rule_flips: list[bool] | None = None) -> list[dict]:
    """`flips.flips` of a ledger whose first 12 cases (repeat 0) carry `flip_rows`' grades."""
    path = copy_ledger(plain, tmp_path / "flips.db")
    db = Database(path)
    db.execute("delete from grades")
    cases = [r[0] for r in db.execute("select distinct case_id from requests order by case_id limit 12")]
    run_id = db.execute("select id from runs").fetchone()[0]
    grades = []
    for r in flip_rows(12, flipped, rule_flips):
        rid = db.execute("select id from requests where variant = ? and case_id = ? and repeat = 0",
                         [r["variant"].replace("cand", "w8a8"), cases[int(r["case_id"][1:])]]).fetchone()[0]
        grades += [{"request_id": rid, "run_id": run_id, "grader": name, "grader_version": "1", "value": g["value"],
                    "passed": g["passed"], "detail_json": json.dumps(g["detail"])} for name, g in r["grades"].items()]
    db["grades"].insert_all(grades)
    db.conn.commit()
    db.close()
    with open_ledger(path, create=False) as led:
        return flips.flips(led, run_id, "base")


def test_the_table_counts_both_directions_and_each_rule(two_variants, tmp_path):
    table = _table(two_variants, tmp_path, [i < 4 for i in range(12)], [i < 3 for i in range(12)])
    schema = next(e for e in table if e["grader"] == "schema")
    rule = next(e for e in table if e["rule"] == "mentions_company")
    assert (schema["gains"], schema["losses"], rule["losses"], rule["flip_pct"]) == (2, 2, 3, 25.0)


def test_the_table_has_no_net_change_when_gains_and_losses_cancel(two_variants, tmp_path):
    table = _table(two_variants, tmp_path, [i < 4 for i in range(12)])
    assert next(e for e in table if e["grader"] == "schema")["net_pp"] == 0.0


def test_showing_flips_below_5pp_needs_72_cases():
    assert cases_to_show_below(5.0) == 72


def test_with_no_flip_at_all_72_cases_show_the_rate_below_5pp():
    assert FlipRate(0, 72).interval(0.05)[1] < 5.0


def test_the_report_line_names_the_cases_a_margin_needs(two_variants, tmp_path):
    table = _table(two_variants, tmp_path, [False] * 12)
    assert any("at least 72 cases" in x for x in flips.lines(table, parse_margins("schema_flips=5pp")))
