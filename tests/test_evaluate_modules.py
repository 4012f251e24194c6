"""The graders load as `evaluate` metrics from local paths, offline (hub-loaded metrics cannot)."""

from __future__ import annotations

import json

import pytest

from evalkit.paths import PROJECT_DIR

evaluate = pytest.importorskip("evaluate")


def load(name: str):
    return evaluate.load(str(PROJECT_DIR / "evaluate_modules" / name))


def test_formality_metric():
    r = load("evalkit_formality").compute(
        predictions=["hey!! wanna chat? lol", "Dear Members of the Hiring Committee, I respectfully submit my "
                     "application. Yours faithfully, D."], references=[1, 5])
    assert r["exact_accuracy"] == 1.0 and r["predicted_levels"] == [1, 5]


def test_schema_metric():
    good = json.dumps({"subject": "Hello there", "body": "x" * 50, "sign_off": "Best, M"})
    r = load("evalkit_schema").compute(predictions=[good, "{"], references=["outreach_email", "outreach_email"])
    assert r["schema_pass_rate"] == 0.5 and r["passed"] == [True, False]


def test_drift_metric():
    r = load("evalkit_drift").compute(predictions=["I build payment systems.", "Bananas are yellow."],
                                      references=["I build payment systems.", "The committee met on Tuesday."])
    assert r["cosine"][0] == pytest.approx(1.0, abs=1e-4) and r["cosine"][1] < 0.5
    assert 0 < r["drift_mean"] < 1
