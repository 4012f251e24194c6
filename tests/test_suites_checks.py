"""Every instruction checker on a text that follows it and one that does not; strict against
loose scoring; the language guess; the arguments each instruction takes."""

from __future__ import annotations

import pytest

from evalkit.suites.checks import INSTRUCTIONS, check, clean_kwargs, count_words, describe, split_sentences
from evalkit.suites.instructions import loose_variants, score_instructions
from evalkit.suites.language import detect, is_language

EN = ("The weather in the city was cold this morning, and we decided to walk to the museum because it was close to "
      "our hotel.")
FR = ("Le temps était froid ce matin dans la ville, et nous avons décidé de marcher jusqu'au musée parce qu'il était "
      "près de notre hôtel.")
ES = "El tiempo en la ciudad era frío esta mañana, y decidimos caminar hasta el museo porque estaba cerca de nuestro hotel."
DE = ("Das Wetter in der Stadt war heute Morgen kalt, und wir haben beschlossen, zum Museum zu laufen, weil es nicht "
      "weit von unserem Hotel ist.")

# (instruction id, kwargs, a text that follows it, a text that does not)
CASES = [
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", "one two"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "one two", "one two three"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at most"}, "one two three", "one two three four"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "exactly"}, "one, two; three.", "one two"),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "exactly"},
     "Dr. Smith arrived at 3.5 pm. He left!", "One. Two. Three."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, "A. B? C!", "A. B."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "First.\n***\nSecond.\n***\nThird.",
     "First.\n***\n***\nThird."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
     "Intro here.\n\nHowever, the end.", "Intro here.\n\nThe end, however."),
    ("keywords:existence", {"keywords": ["castle", "museum"]}, "The Castle and the museum.", "The castle only."),
    ("keywords:forbidden_words", {"forbidden_words": ["very", "good"]}, "Everything was goodish and fine.",
     "It was very nice."),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "at least"}, "Tea, then more tea.",
     "Only one tea."),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "less than"}, "One tea.", "Tea and tea."),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "A zebra.",
     "Zany zebras."),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 3, "let_relation": "at least"}, "Eleven trees",
     "A cat"),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{a: 1}"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n- two", "* one\n* two\n* three"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", "*one* and ** **"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nIntro\nSection 2\nEnd", "Section 1\nIntro only"),
    ("detectable_format:title", {}, "<<A Day Out>>\nText", "<< >>\nText"),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", "Maybe."),
    ("change_case:english_lowercase", {}, "all lower case here.", "Not all lower."),
    ("change_case:english_capital", {}, "ALL CAPS HERE.", "ALL CAPS Here."),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"}, "NASA and ESA met.",
     "Only NASA."),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"}, "Only NASA.",
     "NASA and ESA."),
    ("punctuation:no_comma", {}, "No commas here.", "Yes, a comma."),
    ("startend:end_checker", {"end_phrase": "Any other thoughts?"}, "Done. Any other thoughts?  ",
     "Any other thoughts? Yes."),
    ("startend:start_checker", {"start_phrase": "In short:"}, "In short: yes.", "Briefly, in short: yes."),
    ("startend:quotation", {}, '"Quoted."', 'Quoted."'),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\nP.S. See you.", "Hello. PS see you."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.P.S. More.", "Hi.\nP.S. More."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", "Dear [name]."),
    ("language:response_language", {"language": "fr"}, FR, EN),
    ("language:response_language", {"language": "es"}, ES, FR),
    ("language:response_language", {"language": "de"}, DE, EN),
    ("language:response_language", {"language": "en"}, EN, DE),
    ("language:response_language", {"language": "ru"}, "Сегодня утром в городе было холодно, и мы пошли в музей.", EN),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", "Same.\n******\nSame."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Describe a cat."}, "Describe a cat. A cat is small.",
     "A cat is small."),
]


@pytest.mark.parametrize(("iid", "kwargs", "good", "bad"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_checker_passes_a_following_text(iid, kwargs, good, bad):
    assert check(iid, good, clean_kwargs(iid, kwargs))


@pytest.mark.parametrize(("iid", "kwargs", "good", "bad"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_checker_fails_a_text_that_does_not_follow(iid, kwargs, good, bad):
    assert not check(iid, bad, clean_kwargs(iid, kwargs))


def test_every_instruction_has_a_checker_case():
    assert {c[0] for c in CASES} == set(INSTRUCTIONS)


@pytest.mark.parametrize("iid", sorted(INSTRUCTIONS))
def test_an_empty_response_follows_no_instruction(iid):
    kwargs = next(clean_kwargs(c[0], c[1]) for c in CASES if c[0] == iid)
    assert not check(iid, "   ", kwargs)


@pytest.mark.parametrize("iid", sorted(INSTRUCTIONS))
def test_every_instruction_can_be_described(iid):
    kwargs = next(clean_kwargs(c[0], c[1]) for c in CASES if c[0] == iid)
    assert len(describe(iid, kwargs)) > 20


def test_loose_tries_the_response_without_its_first_line():
    text = "Sure, here it is:\nall lower case here."
    [r] = score_instructions(text, [("change_case:english_lowercase", {})])
    assert (r.strict, r.loose) == (False, True)


def test_loose_tries_the_response_without_its_last_line():
    text = "No commas here\nHope that helps, friend!"
    [r] = score_instructions(text, [("punctuation:no_comma", {})])
    assert (r.strict, r.loose) == (False, True)


def test_loose_tries_the_response_without_markup():
    text = '**"Quoted."**'
    [r] = score_instructions(text, [("startend:quotation", {})])
    assert (r.strict, r.loose) == (False, True)


def test_loose_cannot_rescue_a_response_that_fails_every_variant():
    [r] = score_instructions("Yes, a comma,\nand another, here,\nand more, too.", [("punctuation:no_comma", {})])
    assert (r.strict, r.loose) == (False, False)


def test_a_strict_pass_is_a_loose_pass():
    [r] = score_instructions("No commas.", [("punctuation:no_comma", {})])
    assert (r.strict, r.loose) == (True, True)


def test_loose_variants_are_the_eight_of_ifeval():
    v = loose_variants("first\n*mid*\nlast")
    assert v == ["first\n*mid*\nlast", "*mid*\nlast", "first\n*mid*", "*mid*", "first\nmid\nlast", "mid\nlast",
                 "first\nmid", "mid"]


def test_words_are_runs_of_word_characters():
    assert count_words("It's a well-known fact: 3.5 apples.") == 9


def test_an_abbreviation_does_not_end_a_sentence():
    assert split_sentences("Mr. Brown met Dr. Green at 9 a.m. today. They talked.") == [
        "Mr. Brown met Dr. Green at 9 a.m. today.", "They talked."]


@pytest.mark.parametrize(("text", "code"), [(EN, "en"), (FR, "fr"), (ES, "es"), (DE, "de")])
def test_the_language_guess_tells_latin_script_languages_apart(text, code):
    assert detect(text) == code


def test_the_language_guess_declines_a_short_text():
    assert detect("Oui.") is None


def test_a_shared_script_passes_for_each_language_written_in_it():
    text = "Сегодня утром в городе было холодно, и мы пошли в музей."
    assert is_language(text, "bg")


def test_a_wrong_script_fails_the_language_check():
    assert not is_language("今朝は町がとても寒かったので、私たちはホテルから美術館まで歩くことにしました。", "ko")


@pytest.mark.parametrize(("iid", "kwargs", "field"), [
    ("length_constraints:number_words", {"num_words": 5}, "relation: missing"),
    ("length_constraints:number_words", {"num_words": "5", "relation": "at least"}, "num_words: expected int"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "around"}, "relation: 'around' is not one of"),
    ("keywords:existence", {"keywords": []}, "keywords: expected a non-empty list"),
    ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 2, "let_relation": "at least"}, "letter: expected one"),
    ("punctuation:no_comma", {"extra": 1}, "extra: not an argument of punctuation:no_comma"),
    ("language:response_language", {"language": "xx"}, "language: 'xx' is not one of"),
])
def test_bad_arguments_name_the_argument(iid, kwargs, field):
    with pytest.raises(ValueError, match=field):
        clean_kwargs(iid, kwargs)


def test_none_arguments_are_dropped_as_in_the_hugging_face_layout():
    assert clean_kwargs("punctuation:no_comma", {"num_words": None, "relation": None}) == {}
