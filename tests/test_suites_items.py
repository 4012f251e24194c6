"""The shipped suites: their sizes, tiers and determinism, every arithmetic answer recomputed by
independent code from the item's parameters, items as cases, specs and the stratified subset."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction

import pytest

from evalkit.errors import SuiteError
from evalkit.suites import (
    INSTRUCTIONS,
    TEMPLATES,
    describe,
    generate,
    parse_specs,
    shipped_arithmetic,
    shipped_choice,
    shipped_instructions,
    suite_cases,
)
from evalkit.suites.items import NumericItem


@pytest.fixture(scope="module")
def arithmetic() -> list[NumericItem]:
    return [i for i in shipped_arithmetic().items if isinstance(i, NumericItem)]


def test_at_least_150_instruction_prompts():
    assert len(shipped_instructions().items) >= 150


def test_every_instruction_prompt_has_one_to_three_instructions():
    assert {len(i.instructions) for i in shipped_instructions().items} <= {1, 2, 3}


def test_every_checker_is_used_by_the_shipped_prompts():
    used = {iid for item in shipped_instructions().items for iid, _ in item.instructions}
    assert used == set(INSTRUCTIONS)


def test_every_shipped_prompt_says_each_of_its_instructions():
    missing = [(i.id, iid) for i in shipped_instructions().items for iid, kw in i.instructions
               if describe(iid, kw) not in i.prompt]
    assert not missing


def test_shipped_instruction_keys_are_unique():
    ids = [i.id for i in shipped_instructions().items]
    assert len(ids) == len(set(ids))


def test_at_least_500_arithmetic_items(arithmetic):
    assert len(arithmetic) >= 500


def test_arithmetic_has_three_tiers_in_every_template(arithmetic):
    tiers = {(i.category, i.tier) for i in arithmetic}
    assert tiers == {(t, k) for t in TEMPLATES for k in (1, 2, 3)}


def test_arithmetic_ids_are_unique(arithmetic):
    assert len({i.id for i in arithmetic}) == len(arithmetic)


def test_an_arithmetic_item_is_clustered_by_its_template(arithmetic):
    assert all(i.cluster == i.category for i in arithmetic)


def test_the_same_seed_gives_the_same_items():
    assert generate(seed=3) == generate(seed=3)


def test_another_seed_gives_other_items():
    assert [i.question for i in generate(seed=3)] != [i.question for i in generate(seed=4)]


def test_at_least_100_choice_items():
    assert len(shipped_choice().items) >= 100


def test_choice_items_have_four_options_each():
    assert {len(i.options) for i in shipped_choice().items} == {4}


def test_choice_gold_positions_are_spread():
    golds = Counter(i.gold for i in shipped_choice().items)
    assert min(golds.values()) >= 20


def test_choice_has_five_subjects():
    assert len({i.category for i in shipped_choice().items}) == 5


# --- arithmetic answers, recomputed independently (Fractions, a Julian day number, plain loops) ---

def _jdn(iso: str) -> int:
    """Julian day number of a Gregorian date (Fliegel & Van Flandern), not datetime."""
    y, m, d = (int(x) for x in iso.split("-"))
    a = (14 - m) // 12
    yy, mm = y + 4800 - a, m + 12 * a - 3
    return d + (153 * mm + 2) // 5 + 365 * yy + yy // 4 - yy // 100 + yy // 400 - 32045


def _day_of_month(jdn: int) -> int:
    a = jdn + 32044
    b = (4 * a + 3) // 146097
    c = a - 146097 * b // 4
    d = (4 * c + 3) // 1461
    e = c - 1461 * d // 4
    m = (5 * e + 2) // 153
    return e - (153 * m + 2) // 5 + 1


def _round_cents(x: Fraction) -> Fraction:
    return Fraction(int(x * 100 + Fraction(1, 2)), 100)  # half up (positive amounts)


def recompute(template: str, p: dict) -> Fraction:
    F = Fraction
    if template == "shopping_total":
        return sum(n * F(price) for n, price in p["items"])
    if template == "change_due":
        return p["paid"] - sum(n * F(price) for n, price in p["items"])
    if template == "distance_metres":
        return F(p["km"]) * 1000 * p["days"] + p["extra_m"]
    if template == "duration_minutes":
        return F(60 * p["hours"] + p["minutes"]) * p["per_week"] * p["weeks"]
    if template == "date_difference":
        return F(_jdn(p["end"]) - _jdn(p["start"]))
    if template == "date_after":
        return F(_day_of_month(_jdn(p["start"]) + p["days"]))
    if template == "weekday_count":
        start, end = _jdn(p["start"]), _jdn(p["end"])
        return F(sum(1 for j in range(start, end + 1) if j % 7 == p["weekday"]))  # JDN mod 7: 0 is Monday
    if template == "multiples":
        def upto(n: int, k: int) -> int:
            return n // k
        lo, hi, k, m = p["lo"], p["hi"], p["k"], p["m"]
        one = upto(hi, k) - upto(lo - 1, k)
        if m is None:
            return F(one)
        lcm = k * m // __import__("math").gcd(k, m)
        return F(one + upto(hi, m) - upto(lo - 1, m) - (upto(hi, lcm) - upto(lo - 1, lcm)))
    if template == "round_robin":
        a, b = p["a"], p["b"]
        return F(sum(1 for i in range(a) for j in range(a) if i < j) * (2 if p["twice"] else 1)
                 + sum(1 for i in range(b) for j in range(b) if i < j) + a * b)
    if template == "percent_price":
        x = F(p["price"]) * (100 - p["discount"]) / 100
        if p["form"] == "of":
            return F(p["price"]) * p["discount"] / 100
        return x if p["form"] == "sale" else x * (100 + p["tax"]) / 100 * p["qty"]
    if template == "percent_change":
        return F(p["new"] - p["old"], p["old"]) * 100
    if template == "wages":
        rate, h = F(p["rate"]), p["hours"]
        return (rate * min(h, 40) + rate * F(3, 2) * max(h - 40, 0)) * p["weeks"]
    if template == "savings":
        return F(p["start"] + sum(p["first"] + p["increase"] * k for k in range(p["weeks"])))
    if template == "stock":
        return F(p["start"] + sum(n if kind == "receives" else -n for kind, n in p["events"]))
    if template == "shared_bill":
        share = F(p["bill"]) * (100 + p["tip"]) / 100 / p["people"]
        return _round_cents(share) if p["rounded"] else share
    if template == "speed_time":
        return F(p["speed"] * p["minutes"] * p["legs"], 60)
    raise AssertionError(f"no independent computation for {template}")


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_arithmetic_answers_agree_with_an_independent_computation(arithmetic, template):
    wrong = [(i.id, i.answer, str(recompute(template, i.params))) for i in arithmetic if i.category == template
             and Fraction(i.answer) != recompute(template, i.params)]
    assert not wrong


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_arithmetic_questions_end_as_questions(arithmetic, template):
    assert all(i.question.endswith(("?", ".)")) for i in arithmetic if i.category == template)


# --- items as cases ---

def test_a_case_id_names_its_suite_and_item():
    [case] = suite_cases("choice", limit=1)
    assert case.id.startswith("suite/choice/")


@pytest.mark.parametrize("name", ["instructions", "arithmetic", "choice"])
def test_case_attributes_are_json_serialisable(name):
    cases = suite_cases(name)
    assert json.loads(json.dumps([c.attributes for c in cases])) == [c.attributes for c in cases]


@pytest.mark.parametrize(("name", "scoring"), [("instructions", "instructions"), ("arithmetic", "numeric"),
                                               ("choice", "choice")])
def test_every_case_carries_what_its_grader_reads(name, scoring):
    keys = {"instructions": {"instructions"}, "numeric": {"answer"}, "choice": {"options", "gold", "gold_letter"}}
    cases = suite_cases(name)
    assert all(keys[scoring] | {"suite", "scoring", "category", "cluster", "suite_max_tokens"} <= set(c.attributes)
               for c in cases)


def test_an_arithmetic_case_carries_its_tier():
    cases = suite_cases("arithmetic")
    assert {c.attributes["tier"] for c in cases} == {1, 2, 3}


def test_a_case_leaves_the_trace_length_field_unset():
    # Case.max_tokens makes the sender force the length (ignore_eos): suites carry suite_max_tokens instead
    assert all(c.max_tokens is None for c in suite_cases("instructions,arithmetic,choice"))


def test_a_long_instruction_prompt_gets_more_room():
    cases = suite_cases("instructions")
    long = [c for c in cases if any(i["id"] == "length_constraints:number_words" and i["kwargs"]["num_words"] >= 300
                                    and i["kwargs"]["relation"] == "at least" for i in c.attributes["instructions"])]
    assert all(c.attributes["suite_max_tokens"] >= 700 for c in long)


def test_a_choice_case_asks_for_the_letter():
    [case] = suite_cases("choice", limit=1)
    assert "Answer with the letter of the correct option (A, B, C or D)." in case.messages[0].content


def test_an_arithmetic_case_asks_for_the_hash_line():
    [case] = suite_cases("arithmetic", limit=1)
    assert '"#### <number>"' in case.messages[0].content


# --- specs and the subset ---

def test_specs_parse_a_comma_separated_list():
    assert [str(s) for s in parse_specs("instructions, arithmetic,gsm8k:data/test.jsonl")] == [
        "instructions", "arithmetic", "gsm8k:data/test.jsonl"]


@pytest.mark.parametrize(("spec", "message"), [
    ("nope", r"unknown suite 'nope' \(known: arc:FILE, arithmetic, choice, gsm8k:FILE, ifeval:FILE, instructions, "
             r"mmlu:FILE\)"),
    ("arithmetic:x.jsonl", "is shipped with evalkit and takes no file"),
    ("gsm8k", r"give it as gsm8k:FILE"),
    ("choice,choice", "listed twice"),
    ("", "no suite named"),
])
def test_a_bad_spec_is_one_line_naming_the_known_suites(spec, message):
    with pytest.raises(SuiteError, match=message):
        parse_specs(spec)


def test_a_limited_subset_is_seeded():
    a = [c.id for c in suite_cases("instructions,arithmetic,choice", limit=30, seed=5)]
    b = [c.id for c in suite_cases("instructions,arithmetic,choice", limit=30, seed=5)]
    assert a == b


def test_another_seed_picks_another_subset():
    a = [c.id for c in suite_cases("arithmetic", limit=30, seed=5)]
    b = [c.id for c in suite_cases("arithmetic", limit=30, seed=6)]
    assert a != b


def test_a_limited_subset_is_balanced_over_suites():
    cases = suite_cases("instructions,arithmetic,choice", limit=30)
    assert Counter(c.attributes["suite"] for c in cases) == {"instructions": 10, "arithmetic": 10, "choice": 10}


def test_a_limited_subset_spreads_over_categories():
    cases = suite_cases("arithmetic", limit=32)
    assert Counter(c.attributes["category"] for c in cases) == {t: 2 for t in TEMPLATES}


def test_no_limit_keeps_every_case():
    assert len(suite_cases("choice")) == len(shipped_choice().items)
