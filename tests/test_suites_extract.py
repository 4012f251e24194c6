"""Answers pulled out of free text: which rule parsed them, what they are, and what is unparsed."""

from __future__ import annotations

import pytest

from evalkit.suites.extract import extract_letter, extract_number, reference_number
from evalkit.suites.numbers import canonical, parse_number, same_number


@pytest.mark.parametrize(("text", "value", "how"), [
    ("3 + 4 = 7\n#### 7", "7", "hash"),
    ("#### 1,000", "1000", "hash"),
    ("So the total is 12.\n#### $1,200.50", "1200.5", "hash"),
    ("#### 42 apples", "42", "hash"),
    ("#### -3", "-3", "hash"),
    ("First 5, then 6.\nThe answer is 11.", "11", "answer_is"),
    ("Answer: 75 minutes", "75", "answer_is"),
    ("The final answer is: **$18**", "18", "answer_is"),
    ("We get \\boxed{256} in the end, 3 steps", "256", "boxed"),
    ("7 times 8 makes 56.", "56", "last_number"),
    ("It costs $0.75 each, so 3 cost $2.25.", "2.25", "last_number"),
    ("Two then 3 then 4.5%", "4.5", "last_number"),
    ("#### none\nSo it is 9.", "9", "last_number"),
    ("answer: 1,000.0", "1000", "answer_is"),
])
def test_a_number_is_extracted_with_how_it_was_parsed(text, value, how):
    ex = extract_number(text)
    assert (ex.value, ex.how) == (value, how)


@pytest.mark.parametrize("text", ["", "I do not know.", "The answer is unclear.", "####"])
def test_a_text_without_a_number_is_unparsed(text):
    ex = extract_number(text)
    assert (ex.value, ex.how, ex.parsed) == (None, "unparsed", False)


def test_the_hash_line_wins_over_a_later_number():
    assert extract_number("#### 12\nI hope 3 steps were clear.").value == "12"


def test_the_last_hash_line_is_the_answer():
    assert extract_number("#### 5\nwait, no\n#### 6").value == "6"


@pytest.mark.parametrize(("a", "b"), [("1,000.0", "1000"), ("$12.50", "12.5"), ("-0", "0"), ("007", "7"),
                                      ("3.10", "3.1")])
def test_numbers_compare_exactly_after_normalisation(a, b):
    assert same_number(parse_number(a), b)


@pytest.mark.parametrize(("a", "b"), [("1000.01", "1000"), ("12.5", "125"), ("0.1", "0.10000001")])
def test_different_numbers_differ(a, b):
    assert not same_number(a, b)


def test_a_missing_number_is_never_equal():
    assert not same_number(None, "0")


def test_canonical_has_no_exponent():
    assert canonical("1E+3") == "1000"


def test_a_reference_needs_its_hash_line():
    assert reference_number("Natalia sold 48/2 = 24 clips in May.\n#### 72") == "72"


def test_a_reference_without_a_hash_line_is_none():
    assert reference_number("Natalia sold 72 clips.") is None


def test_a_reference_with_two_numbers_on_its_hash_line_is_none():
    assert reference_number("#### 72 or 73") is None


@pytest.mark.parametrize(("text", "value", "how"), [
    ("The answer is (D).", "D", "answer_is"),
    ("Answer: C", "C", "answer_is"),
    ("After thinking, the answer is **B** because ...", "B", "answer_is"),
    ("The correct option is A.", "A", "answer_is"),
    ("B", "B", "letter"),
    ("B. Paris", "B", "letter"),
    ("(C) Ottawa", "C", "letter"),
    ("**A**", "A", "letter"),
    ("D) none of these", "D", "letter"),
    ("I would pick (B) since it is the capital.", "B", "letter_paren"),
    ("Ottawa", "B", "option_text"),
])
def test_a_letter_is_extracted_with_how_it_was_parsed(text, value, how):
    ex = extract_letter(text, 4, ["Toronto", "Ottawa", "Vancouver", "Montreal"])
    assert (ex.value, ex.how) == (value, how)


@pytest.mark.parametrize("text", [
    "A cat is not a dog.",            # a word that starts with A is no letter
    "Either (A) or (B) could be right.",  # two different letters in parentheses
    "The answer is E.",               # beyond four options
    "I am not sure.",
    "",
])
def test_an_ambiguous_or_missing_letter_is_unparsed(text):
    ex = extract_letter(text, 4)
    assert (ex.value, ex.how) == (None, "unparsed")


def test_a_fifth_option_is_a_letter_when_the_item_has_five():
    assert extract_letter("The answer is E.", 5).value == "E"


def test_a_lowercase_letter_after_answer_is_not_a_choice():
    assert extract_letter("The answer is a matter of taste.", 4).value is None
