from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from evalkit.errors import DatasetError
from evalkit.grading.resume import resume
from evalkit.paths import PROJECT_DIR, default_dataset_path
from evalkit.spec.dataset import load_cases, stratified_subset


def test_shipped_dataset_has_the_benchmark_axes():
    cases = load_cases()
    assert len(cases) >= 120
    a = [resume(c) for c in cases]
    assert {x.task for x in a} == {"cold_outreach", "profile_rewrite"}
    assert len({x.persona for x in a}) >= 8
    assert len({x.candidate for x in a}) >= 3
    assert {c.complexity for c in cases} == {"short", "medium", "long"}
    assert {x.formality for x in a} == {1, 2, 3, 4, 5}
    # every complexity sees every formality level
    assert {(c.complexity, x.formality) for c, x in zip(cases, a, strict=True)} == {
        (cx, f) for cx in ("short", "medium", "long") for f in range(1, 6)}


def test_long_prompts_are_much_longer_than_short():
    cases = load_cases()
    words = {x: min(sum(len(m.content.split()) for m in c.messages) for c in cases if c.complexity == x)
             for x in ("short", "medium", "long")}
    assert words["short"] < words["medium"] < words["long"]
    assert words["long"] > 6 * words["short"]  # ~1.5k vs ~250 prompt tokens


@pytest.mark.integration
def test_builder_is_deterministic_and_committed_file_is_current():
    r = subprocess.run([sys.executable, str(PROJECT_DIR / "data" / "build_dataset.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_loads_with_datasets_library():
    import datasets

    ds = datasets.load_dataset("json", data_files=str(default_dataset_path()), split="train")
    assert ds.num_rows == len(load_cases())
    assert set(ds.column_names) >= {"id", "task", "persona", "complexity", "formality", "schema", "messages"}


def test_stratified_subset_is_balanced_and_deterministic():
    cases = load_cases()
    a = stratified_subset(cases, 12, subset_seed=0)
    b = stratified_subset(cases, 12, subset_seed=0)
    assert [c.id for c in a] == [c.id for c in b]
    assert Counter(c.complexity for c in a) == {"short": 4, "medium": 4, "long": 4}
    assert Counter(resume(c).task for c in a) == {"cold_outreach": 6, "profile_rewrite": 6}
    assert len({resume(c).persona for c in a}) >= 4
    assert [c.id for c in stratified_subset(cases, 12, subset_seed=1)] != [c.id for c in a]
    assert len(stratified_subset(cases, None)) == len(cases)
    # any prefix of the order is balanced too
    assert Counter(c.complexity for c in a[:6]) == {"short": 2, "medium": 2, "long": 2}
    assert Counter(c.complexity for c in a[:3]) == {"short": 1, "medium": 1, "long": 1}


def _row(shipped_rows: list[dict], **changes) -> dict:
    row = dict(shipped_rows[0])
    row.update(changes)
    return row


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: "{not json", ":2: not valid JSON"),
        (lambda r: json.dumps({**r, "schema": "nope"}), "field 'schema': unknown schema 'nope'"),
        (lambda r: json.dumps({**r, "id": "x"} | {"messages": []}), "field 'messages'"),
        (lambda r: json.dumps(r), "field 'id': duplicate id"),
        (lambda r: "[1, 2]", ":2: a row must be a JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, shipped_rows, mutate, expected):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(shipped_rows[0]) + "\n" + mutate(shipped_rows[0]) + "\n")
    with pytest.raises(DatasetError) as e:
        load_cases(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:2: "), msg
    assert expected in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"formality": 6}, "field 'formality'"),
        ({"formality": "3"}, "field 'formality'"),
        ({"formality": 2.5}, "field 'formality'"),
        ({"context_keys": {"company": "x", "role": "y", "skills": []}}, "field 'context_keys.skills'"),
    ],
)
def test_a_bad_attribute_of_the_resume_workload_names_file_line_and_field(tmp_path: Path, shipped_rows, change,
                                                                           expected):
    from evalkit.grading.registry import choose

    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(shipped_rows[0]) + "\n" + json.dumps({**shipped_rows[0], "id": "other", **change}) + "\n")
    with pytest.raises(DatasetError) as e:
        choose(None, load_cases(p), where=str(p))
    assert str(e.value).startswith(f"{p}:2: {expected}")


def test_a_row_without_the_resume_attributes_is_named_and_the_others_graded(tmp_path: Path, shipped_rows):
    from evalkit.grading.registry import choose

    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(shipped_rows[0]) + "\n"
                 + json.dumps({k: v for k, v in shipped_rows[1].items() if k != "task"}) + "\n")
    names, notes = choose(None, load_cases(p))
    assert notes == ["grader 'persona' grades 1 of 2 cases: the others lack task, which it reads: dataset:2 (task)"]


def test_an_unknown_field_is_an_attribute_not_an_error(tmp_path: Path, shipped_rows):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({**shipped_rows[0], "surprise": 1}) + "\n")
    assert load_cases(p)[0].attributes["surprise"] == 1


def test_missing_and_empty_dataset(tmp_path: Path):
    with pytest.raises(DatasetError, match="not found"):
        load_cases(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no rows"):
        load_cases(tmp_path / "empty.jsonl")
