"""The graders load as `evaluate` metrics from local paths, offline (hub-loaded metrics cannot)."""

from __future__ import annotations

import json

import pytest

from evalkit.paths import PROJECT_DIR

evaluate = pytest.importorskip("evaluate")


def load(name: str):
    return evaluate.load(str(PROJECT_DIR / "evaluate_modules" / name))


@pytest.mark.integration
def test_formality_metric():
    r = load("evalkit_formality").compute(
        predictions=["hey!! wanna chat? lol", "Dear Members of the Hiring Committee, I respectfully submit my "
                     "application. Yours faithfully, D."], references=[1, 5])
    assert r["exact_accuracy"] == 1.0
    assert r["predicted_levels"] == [1, 5]


@pytest.mark.integration
def test_schema_metric():
    good = json.dumps({"subject": "Hello there", "body": "x" * 50, "sign_off": "Best, M"})
    r = load("evalkit_schema").compute(predictions=[good, "{"], references=["outreach_email", "outreach_email"])
    assert r["schema_pass_rate"] == 0.5
    assert r["passed"] == [True, False]


@pytest.mark.integration
def test_drift_metric():
    r = load("evalkit_drift").compute(predictions=["I build payment systems.", "Bananas are yellow."],
                                      references=["I build payment systems.", "The committee met on Tuesday."])
    assert r["cosine"][0] == pytest.approx(1.0, abs=1e-4)
    assert r["cosine"][1] < 0.5
    assert 0 < r["drift_mean"] < 1


@pytest.mark.integration
def test_modules_and_graders_agree_on_the_same_inputs():
    """The evaluate modules wrap the graders, so both give the same answer for every input."""
    from evalkit.grading import GradedRequest, make_graders
    from evalkit.grading.base import bare_case
    from evalkit.grading.embeddings import cosine, embed
    from evalkit.grading.text import prose
    from evalkit.paths import rubrics_dir

    rows = [json.loads(x) for x in (rubrics_dir() / "formality_calibration.jsonl").read_text().splitlines()[:30]]
    texts, levels = [r["text"] for r in rows], [r["level"] for r in rows]
    module = load("evalkit_formality").compute(predictions=texts, references=levels)
    (formality,) = make_graders(["formality"])
    direct = [int(formality.grade(GradedRequest(0, "v", t, None, bare_case(formality=lv))).value)
              for t, lv in zip(texts, levels, strict=True)]
    assert module["predicted_levels"] == direct

    outputs = [json.dumps({"subject": "Hello there", "body": "x" * 50, "sign_off": "Best, M"}), "{", texts[0]]
    module = load("evalkit_schema").compute(predictions=outputs, references=["outreach_email"] * 3)
    (schema,) = make_graders(["schema"])
    assert module["passed"] == [bool(schema.grade(GradedRequest(0, "v", o, None, bare_case())).passed) for o in outputs]

    a, b = texts[:5], texts[5:10]
    module = load("evalkit_drift").compute(predictions=a, references=b)
    va, vb = embed([prose(x) for x in a]), embed([prose(x) for x in b])
    assert module["cosine"] == pytest.approx([cosine(x, y) for x, y in zip(va, vb, strict=True)], abs=1e-5)
