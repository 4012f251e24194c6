"""The user's own copies of GSM8K, MMLU, ARC and IFEval, each written here in its published layout
(csv, jsonl, parquet), read into suites; a bad file is one line naming file:line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.errors import SuiteError
from evalkit.suites import load_suites, read_arc, read_gsm8k, read_ifeval, read_mmlu, suite_cases

GSM = [{"question": "A baker makes 12 rolls and sells 5. How many are left?", "answer": "12 - 5 = <<12-5=7>>7\n#### 7"},
       {"question": "Tom has 1,200 stamps and buys 300. How many now?", "answer": "1200 + 300 = 1500\n#### 1,500"}]
MMLU_HF = [{"question": "What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "6"],
            "answer": 1},
           {"question": "Which gas do we breathe out?", "subject": "biology", "choices": ["O2", "N2", "CO2", "He"],
            "answer": 2}]
ARC_HF = [{"id": "Q1", "question": "Which is a liquid at room temperature?",
           "choices": {"text": ["Iron", "Water", "Salt"], "label": ["A", "B", "C"]}, "answerKey": "B"},
          {"id": "Q2", "question": "Which planet is largest?",
           "choices": {"text": ["Mars", "Earth", "Jupiter", "Venus"], "label": ["1", "2", "3", "4"]}, "answerKey": "3"}]
ARC_AI2 = [{"id": "Q9", "question": {"stem": "What melts ice fastest?", "choices": [
    {"text": "Heat", "label": "A"}, {"text": "Shade", "label": "B"}, {"text": "Wind", "label": "C"},
    {"text": "Night", "label": "D"}]}, "answerKey": "A"}]
IFEVAL = [{"key": 1, "prompt": "Write a haiku. Do not use commas.", "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": [{}]},
          {"key": 2, "prompt": "Describe rain in at least 30 words, all lowercase.",
           "instruction_id_list": ["length_constraints:number_words", "change_case:english_lowercase"],
           "kwargs": [{"num_words": 30, "relation": "at least"}, {}]}]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --- GSM8K ---

@pytest.mark.parametrize("write", [jsonl, parquet])
def test_gsm8k_reads_the_final_hash_line_as_the_answer(tmp_path, write):
    suite = read_gsm8k(write(tmp_path / ("test" + (".jsonl" if write is jsonl else ".parquet")), GSM))
    assert [i.answer for i in suite.items] == ["7", "1500"]


def test_a_gsm8k_case_is_numeric_and_clustered_by_item(tmp_path):
    p = jsonl(tmp_path / "test.jsonl", GSM)
    case = suite_cases(f"gsm8k:{p}")[0]
    assert (case.id, case.attributes["scoring"], case.attributes["cluster"]) == ("suite/gsm8k/test-1", "numeric",
                                                                                 "test-1")


def test_a_gsm8k_answer_without_its_hash_line_is_a_data_error(tmp_path):
    p = jsonl(tmp_path / "test.jsonl", [GSM[0], {"question": "q?", "answer": "It is 7."}])
    with pytest.raises(SuiteError, match=r"test.jsonl:2: field 'answer': no final '#### <number>' line"):
        read_gsm8k(p)


def test_a_gsm8k_row_without_a_question_names_the_field(tmp_path):
    p = jsonl(tmp_path / "test.jsonl", [{"answer": "#### 1"}])
    with pytest.raises(SuiteError, match=r"test.jsonl:1: field 'question': missing"):
        read_gsm8k(p)


def test_a_line_that_is_not_json_names_its_line(tmp_path):
    p = tmp_path / "test.jsonl"
    p.write_text(json.dumps(GSM[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"test.jsonl:2: not valid JSON"):
        read_gsm8k(p)


# --- MMLU ---

MMLU_CSV = 'What is 3 x 3?,6,9,12,3,B\n"A question, with a comma?",yes,no,"maybe, perhaps",never,C\n'


def test_mmlu_csv_takes_its_subject_from_the_file_name(tmp_path):
    p = tmp_path / "high_school_math_test.csv"
    p.write_text(MMLU_CSV, encoding="utf-8")
    assert {i.category for i in read_mmlu(p).items} == {"high_school_math"}


def test_mmlu_csv_reads_quoted_fields_and_the_answer_letter(tmp_path):
    p = tmp_path / "logic_test.csv"
    p.write_text(MMLU_CSV, encoding="utf-8")
    item = read_mmlu(p).items[1]
    assert (item.question, item.options[2], item.gold) == ("A question, with a comma?", "maybe, perhaps", 2)


def test_mmlu_reads_a_folder_of_csv_files(tmp_path):
    for name in ("anatomy_test.csv", "virology_test.csv"):
        (tmp_path / name).write_text(MMLU_CSV, encoding="utf-8")
    assert len(read_mmlu(tmp_path).items) == 4


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_mmlu_reads_the_hugging_face_layout(tmp_path, write):
    suite = read_mmlu(write(tmp_path / ("m" + (".jsonl" if write is jsonl else ".parquet")), MMLU_HF))
    assert [(i.category, i.gold) for i in suite.items] == [("elementary_mathematics", 1), ("biology", 2)]


def test_an_mmlu_case_is_clustered_by_subject(tmp_path):
    p = jsonl(tmp_path / "m.jsonl", MMLU_HF)
    assert [c.attributes["cluster"] for c in suite_cases(f"mmlu:{p}")] == ["elementary_mathematics", "biology"]


def test_an_mmlu_csv_row_with_a_bad_answer_names_line_and_field(tmp_path):
    p = tmp_path / "x_test.csv"
    p.write_text("Q1?,a,b,c,d,A\nQ2?,a,b,c,d,E\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"x_test.csv:2: field 'answer': expected A, B, C or D, got 'E'"):
        read_mmlu(p)


def test_an_mmlu_csv_row_with_missing_columns_names_its_line(tmp_path):
    p = tmp_path / "x_test.csv"
    p.write_text("Q1?,a,b,c,d,A\n\nQ2?,a,b,B\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"x_test.csv:3: field '\(row\)': expected 6 columns"):
        read_mmlu(p)


def test_an_mmlu_row_with_an_answer_out_of_range_names_the_field(tmp_path):
    p = jsonl(tmp_path / "m.jsonl", [{**MMLU_HF[0], "answer": 4}])
    with pytest.raises(SuiteError, match=r"m.jsonl:1: field 'answer': expected the gold option's index 0-3, got 4"):
        read_mmlu(p)


# --- ARC ---

@pytest.mark.parametrize("write", [jsonl, parquet])
def test_arc_reads_letter_and_digit_labels(tmp_path, write):
    suite = read_arc(write(tmp_path / ("ARC-Challenge-Test" + (".jsonl" if write is jsonl else ".parquet")), ARC_HF))
    assert [(i.id, i.gold, len(i.options)) for i in suite.items] == [("Q1", 1, 3), ("Q2", 2, 4)]


def test_arc_takes_challenge_or_easy_from_the_path(tmp_path):
    (tmp_path / "ARC-Easy").mkdir()
    p = jsonl(tmp_path / "ARC-Easy" / "test.jsonl", ARC_HF)
    assert {i.category for i in read_arc(p).items} == {"easy"}


def test_arc_without_a_split_in_the_path_uses_the_file_stem(tmp_path):
    p = jsonl(tmp_path / "science.jsonl", ARC_HF)
    assert {i.category for i in read_arc(p).items} == {"science"}


def test_arc_reads_the_original_ai2_layout(tmp_path):
    item = read_arc(jsonl(tmp_path / "ARC-Easy-Dev.jsonl", ARC_AI2)).items[0]
    assert (item.question, item.options, item.gold) == ("What melts ice fastest?", ("Heat", "Shade", "Wind", "Night"), 0)


def test_an_arc_case_shows_letters_whatever_the_labels(tmp_path):
    p = jsonl(tmp_path / "arc.jsonl", ARC_HF)
    case = suite_cases(f"arc:{p}")[1]
    assert (case.attributes["gold_letter"], "C. Jupiter" in case.messages[0].content) == ("C", True)


def test_an_arc_answer_key_not_among_the_labels_names_the_field(tmp_path):
    p = jsonl(tmp_path / "arc.jsonl", [ARC_HF[0], {**ARC_HF[1], "answerKey": "E"}])
    with pytest.raises(SuiteError, match=r"arc.jsonl:2: field 'answerKey': 'E' is not one of the labels 1, 2, 3, 4"):
        read_arc(p)


def test_arc_duplicate_ids_name_both_lines(tmp_path):
    p = jsonl(tmp_path / "arc.jsonl", [ARC_HF[0], ARC_HF[0]])
    with pytest.raises(SuiteError, match=r"arc.jsonl:2: field 'id': duplicate id 'Q1' \(first at .*arc.jsonl:1\)"):
        read_arc(p)


def test_an_arc_csv_is_refused_in_one_line(tmp_path):
    p = tmp_path / "arc.csv"
    p.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"arc.csv: ARC is read from jsonl or parquet files, not '.csv'"):
        read_arc(p)


# --- IFEval ---

@pytest.mark.parametrize("write", [jsonl, parquet])
def test_ifeval_maps_instruction_ids_onto_the_checkers(tmp_path, write):
    suite = read_ifeval(write(tmp_path / ("input_data" + (".jsonl" if write is jsonl else ".parquet")), IFEVAL))
    assert [[i for i, _ in item.instructions] for item in suite.items] == [
        ["punctuation:no_comma"], ["length_constraints:number_words", "change_case:english_lowercase"]]


def test_ifeval_drops_the_null_arguments_of_the_hugging_face_layout(tmp_path):
    keys = {"num_words": None, "relation": None, "language": None, "keywords": None}
    rows = [{**IFEVAL[1], "kwargs": [{**keys, "num_words": 30, "relation": "at least"}, dict(keys)]}]
    item = read_ifeval(parquet(tmp_path / "ifeval.parquet", rows)).items[0]
    assert item.instructions[0][1] == {"num_words": 30, "relation": "at least"}


def test_an_unknown_instruction_id_names_file_line_and_field(tmp_path):
    rows = [IFEVAL[0], {**IFEVAL[0], "key": 3, "instruction_id_list": ["detectable_format:haiku"]}]
    with pytest.raises(SuiteError, match=r"input_data.jsonl:2: field 'instruction_id_list\[0\]': unknown instruction "
                                         r"'detectable_format:haiku' \(known: "):
        read_ifeval(jsonl(tmp_path / "input_data.jsonl", rows))


def test_the_skip_policy_leaves_an_unknown_instruction_out_with_a_note(tmp_path):
    rows = [{**IFEVAL[0], "instruction_id_list": ["punctuation:no_comma", "detectable_format:haiku"],
             "kwargs": [{}, {}]}]
    suite = read_ifeval(jsonl(tmp_path / "input_data.jsonl", rows), unknown="skip")
    assert (len(suite.items[0].instructions), len(suite.notes)) == (1, 1)


def test_the_skip_policy_drops_a_prompt_left_with_no_instruction(tmp_path):
    rows = [IFEVAL[0], {**IFEVAL[0], "key": 3, "instruction_id_list": ["detectable_format:haiku"]}]
    cases = load_suites(f"ifeval:{jsonl(tmp_path / 'input_data.jsonl', rows)}", unknown="skip")[0].items
    assert [i.id for i in cases] == ["1"]


def test_bad_instruction_arguments_name_the_argument(tmp_path):
    rows = [{**IFEVAL[1], "kwargs": [{"num_words": "thirty", "relation": "at least"}, {}]}]
    with pytest.raises(SuiteError, match=r"input_data.jsonl:1: field 'kwargs\[0\].num_words': expected int"):
        read_ifeval(jsonl(tmp_path / "input_data.jsonl", rows))


def test_kwargs_of_the_wrong_length_name_the_field(tmp_path):
    rows = [{**IFEVAL[1], "kwargs": [{}]}]
    with pytest.raises(SuiteError, match=r"input_data.jsonl:1: field 'kwargs': expected a list of 2 objects"):
        read_ifeval(jsonl(tmp_path / "input_data.jsonl", rows))


def test_an_ifeval_case_carries_its_instructions(tmp_path):
    case = suite_cases(f"ifeval:{jsonl(tmp_path / 'input_data.jsonl', IFEVAL)}")[1]
    assert case.attributes["instructions"][0] == {"id": "length_constraints:number_words",
                                                  "kwargs": {"num_words": 30, "relation": "at least"}}


# --- any file ---

def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(SuiteError, match=r"nope.jsonl: file not found"):
        read_gsm8k(tmp_path / "nope.jsonl")


def test_an_unreadable_parquet_file_is_one_line(tmp_path):
    p = tmp_path / "broken.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(SuiteError, match=r"broken.parquet: not a readable parquet file"):
        read_gsm8k(p)


def test_an_empty_file_is_one_line(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"empty.jsonl: no rows"):
        read_gsm8k(p)


def test_a_folder_of_nothing_readable_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(SuiteError, match=r"no .csv, .jsonl, .parquet files in this folder"):
        read_mmlu(tmp_path)


def test_a_shipped_and_a_user_suite_load_together(tmp_path):
    p = jsonl(tmp_path / "test.jsonl", GSM)
    assert [s.name for s in load_suites(f"choice,gsm8k:{p}")] == ["choice", "gsm8k"]
