"""The `accuracy` grader on suite cases: correct, wrong and unparsed answers, instructions strict
and loose, what its aggregate reports, its margin values (whole and per suite), bad attributes."""

from __future__ import annotations

import pytest

from evalkit.grading import registry
from evalkit.grading.accuracy import AccuracyAggregate, AccuracyGrader, split_by_suite
from evalkit.grading.base import GradedRequest, paired_differences
from evalkit.spec.dataset import Case
from evalkit.suites import suite_cases


def _case(name: str, **attrs) -> Case:
    base = {"suite": name, "category": "c", "cluster": "k"}
    return Case.model_validate({"id": f"suite/{name}/x", "messages": [{"role": "user", "content": "q"}],
                                "attributes": {**base, **attrs}})


NUMERIC = _case("arithmetic", scoring="numeric", answer="1500")
CHOICE = _case("choice", scoring="choice", options=["Toronto", "Ottawa", "Vancouver", "Montreal"], gold=1)
INSTR = _case("instructions", scoring="instructions", instructions=[
    {"id": "punctuation:no_comma", "kwargs": {}}, {"id": "change_case:english_lowercase", "kwargs": {}}])


def grade(case: Case, text: str, finish: str = "stop"):
    return AccuracyGrader().grade(GradedRequest(1, "v", text, finish, case))


def test_a_correct_number_scores_one():
    s = grade(NUMERIC, "300 + 1200 = 1500\n#### 1,500")
    assert (s.value, s.passed) == (1.0, True)


def test_a_wrong_number_scores_zero():
    s = grade(NUMERIC, "#### 1400")
    assert (s.value, s.passed) == (0.0, False)


def test_an_unparsed_answer_is_wrong_and_flagged():
    s = grade(NUMERIC, "I cannot say.")
    assert (s.value, s.passed, s.detail["unparsed"]) == (0.0, None, True)


def test_an_unparsed_answer_cut_at_max_tokens_says_so():
    assert "truncated at max_tokens" in grade(NUMERIC, "Let me think about", "length").explanation


def test_the_detail_says_how_the_answer_was_parsed():
    d = grade(NUMERIC, "The answer is 1500.").detail
    assert {k: d[k] for k in ("suite", "category", "cluster", "parsed_as", "extracted", "expected")} == {
        "suite": "arithmetic", "category": "c", "cluster": "k", "parsed_as": "answer_is", "extracted": "1500",
        "expected": "1500"}


def test_a_choice_is_graded_by_its_letter():
    s = grade(CHOICE, "The answer is (B).")
    assert (s.value, s.detail["parsed_as"]) == (1.0, "answer_is")


def test_a_wrong_letter_scores_zero():
    assert grade(CHOICE, "C").passed is False


def test_an_unparsed_choice_is_flagged():
    assert grade(CHOICE, "Either (A) or (C).").detail["unparsed"] is True


def test_instructions_pass_only_when_all_pass_strict():
    s = grade(INSTR, "no commas and all lower case here.")
    assert (s.value, s.detail["prompt_strict"], s.detail["prompt_loose"]) == (1.0, True, True)


def test_instructions_record_each_result_strict_and_loose():
    s = grade(INSTR, "Sure thing, here you go:\nno commas and all lower case here.")
    assert s.detail["instructions"] == [{"id": "punctuation:no_comma", "strict": False, "loose": True},
                                        {"id": "change_case:english_lowercase", "strict": False, "loose": True}]


def test_an_instruction_response_is_never_unparsed():
    s = grade(INSTR, "")
    assert (s.passed, s.detail["unparsed"]) == (False, False)


@pytest.mark.parametrize("name", ["instructions", "arithmetic", "choice"])
def test_every_shipped_case_can_be_graded(name):
    assert all(AccuracyGrader.check_case(c) is None for c in suite_cases(name))


@pytest.mark.parametrize(("attrs", "why"), [
    ({"scoring": "essay"}, "scoring: expected one of"),
    ({"scoring": "numeric", "answer": "many"}, "answer: expected an exact number"),
    ({"scoring": "choice", "options": ["a", "b"], "gold": 2}, "gold: expected the gold option's index 0-1"),
    ({"scoring": "instructions", "instructions": [{"id": "nope", "kwargs": {}}]}, "instructions[0].id: unknown"),
    ({"scoring": "instructions", "instructions": [{"id": "length_constraints:number_words", "kwargs": {}}]},
     "instructions[0].kwargs.num_words: missing"),
])
def test_a_case_carrying_bad_attributes_says_which_field(attrs, why):
    assert AccuracyGrader.check_case(_case("mine", **attrs)).startswith(why)


def test_the_grader_is_registered_as_a_builtin():
    assert registry.available()["accuracy"] is AccuracyGrader


def test_the_grader_declares_an_accuracy_margin_in_pp():
    assert registry.margins()["accuracy"][1].unit == "pp"


def _g(case: str, value: float, suite: str = "arithmetic", *, unparsed: bool = False, repeat: int = 0,
       scoring: str = "numeric", cluster: str | None = None, **detail) -> dict:
    return {"case_id": f"suite/{suite}/{case}", "value": value, "passed": None if unparsed else value == 1.0,
            "repeat": repeat, "detail": {"suite": suite, "scoring": scoring, "unparsed": unparsed,
                                         "cluster": cluster or case, **detail}}


def test_summarise_counts_unparsed_as_wrong_and_apart():
    out = AccuracyAggregate.summarise([_g("a", 1.0), _g("b", 0.0), _g("c", 0.0, unparsed=True), _g("d", 1.0)], None)
    assert (out["accuracy_pct"], out["accuracy_unparsed"], out["accuracy_unparsed_pct"]) == (50.0, 1, 25.0)


def test_summarise_reads_instruction_levels():
    ins = [_g("a", 1.0, "instructions", scoring="instructions", prompt_strict=True, prompt_loose=True,
              instructions=[{"strict": True, "loose": True}, {"strict": True, "loose": True}]),
           _g("b", 0.0, "instructions", scoring="instructions", prompt_strict=False, prompt_loose=True,
              instructions=[{"strict": False, "loose": True}, {"strict": True, "loose": True}])]
    out = AccuracyAggregate.summarise(ins, None)
    assert [out[k] for k in ("instr_prompt_strict_pct", "instr_prompt_loose_pct", "instr_inst_strict_pct",
                             "instr_inst_loose_pct")] == [50.0, 100.0, 75.0, 100.0]


def test_summarise_of_no_grades_is_empty():
    assert AccuracyAggregate.summarise([], None)["accuracy_pct"] is None


def test_summarise_of_a_candidate_reads_recovery_against_the_baseline():
    base = [_g(str(i), 1.0) for i in range(10)]
    cand = [_g(str(i), 1.0 if i < 8 else 0.0) for i in range(10)]
    out = AccuracyAggregate.summarise(cand, base)
    assert (out["recovery_pct"], out["accuracy_lost"]) == (80.0, 2)


def test_summarise_gives_accuracy_per_suite():
    out = AccuracyAggregate.summarise([_g("a", 1.0), _g("b", 0.0, "choice")], None)
    assert out["accuracy_by_suite"] == {"arithmetic": 100.0, "choice": 0.0}


def test_margin_values_keep_unparsed_as_zero_from_the_first_repeat():
    grades = [_g("a", 0.0, unparsed=True), _g("a", 1.0, repeat=1), _g("b", 1.0)]
    assert AccuracyAggregate.margin_values(grades, False)["accuracy"] == {"suite/arithmetic/a": 0.0,
                                                                          "suite/arithmetic/b": 1.0}


def test_margin_values_key_each_suite_as_a_qualified_margin():
    grades = [_g("a", 0.0, unparsed=True), _g("b", 1.0, "gsm8k")]
    assert AccuracyAggregate.margin_values(grades, False)["accuracy:gsm8k"] == {"suite/gsm8k/b": 1.0}


def test_margin_values_split_per_suite():
    grades = [_g("a", 1.0), _g("b", 0.0, "gsm8k")]
    assert AccuracyAggregate.suite_margin_values(grades, False) == {"arithmetic": {"suite/arithmetic/a": 1.0},
                                                                    "gsm8k": {"suite/gsm8k/b": 0.0}}


def test_paired_differences_pair_suite_cases():
    base, cand = [_g("a", 1.0), _g("b", 1.0)], [_g("a", 0.0, unparsed=True), _g("b", 1.0)]
    assert paired_differences(AccuracyAggregate, cand, base)["accuracy"] == [-1.0, 0.0]


def test_a_grade_without_a_suite_in_its_detail_is_split_by_its_case_id():
    assert list(split_by_suite([{"case_id": "suite/mmlu/x-1", "value": 1.0, "detail": {}}])) == ["mmlu"]
