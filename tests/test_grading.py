from __future__ import annotations

import json

import pytest

from evalkit.grading import GradedRequest, make_graders
from evalkit.grading.schema import SchemaGrader
from evalkit.spec.dataset import load_cases


def _item(text: str, finish: str | None = "stop", task: str = "cold_outreach") -> GradedRequest:
    case = next(c for c in load_cases() if c.attributes["task"] == task)
    return GradedRequest(1, "v", text, finish, case)


GOOD_EMAIL = {"subject": "Backend role at Ledgerly", "body": "Dear Priya, " + "I build payment systems. " * 4,
              "sign_off": "Best regards, Maya"}


def test_valid_output_passes():
    s = SchemaGrader().grade(_item(json.dumps(GOOD_EMAIL)))
    assert s.value == 1.0
    assert s.passed
    assert s.detail["errors"] == []


def test_truncated_output_names_the_cause():
    s = SchemaGrader().grade(_item('{"subject": "Hi", "body": "Dear', finish="length"))
    assert not s.passed
    assert s.value == 0.0
    assert s.explanation.startswith("truncated at max_tokens")
    assert s.detail["finish_reason"] == "length"


def test_not_json():
    s = SchemaGrader().grade(_item("Sure! Dear hiring manager"))
    assert not s.passed
    assert s.explanation.startswith("not valid JSON")


def test_failing_path_is_named():
    bad = dict(GOOD_EMAIL, subject="x" * 200)
    del bad["sign_off"]
    s = SchemaGrader().grade(_item(json.dumps(bad)))
    assert not s.passed
    paths = {e["path"] for e in s.detail["errors"]}
    assert paths == {"/", "/subject"}
    assert "(+1 more)" in s.explanation


def test_profile_schema_array_bounds():
    out = {"headline": "Data engineer for the NSO", "summary": "Five years of governed pipelines. " * 3,
           "skills": ["SQL"] * 7}
    s = SchemaGrader().grade(_item(json.dumps(out), task="profile_rewrite"))
    assert not s.passed
    assert s.detail["errors"][0]["path"] == "/skills"


@pytest.mark.integration
def test_unknown_grader_is_a_usage_error():
    import pytest

    from evalkit.errors import UsageError

    with pytest.raises(UsageError, match="unknown grader"):
        make_graders(["nope"])
