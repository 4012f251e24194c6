"""The LLM judge's request and answer (issue 35): a vLLM judge is asked for a constrained JSON answer
(`{"score": N, "reason"}`), another server plainly, one that refuses the constraint (HTTP 400) again without it; the
grade says how it was asked, and the parsing stays tolerant. No server: the transport is replaced."""

from __future__ import annotations

import io
import json
import urllib.error
from typing import Any

import pytest

from evalkit.grading.base import GradedRequest
from evalkit.grading.judge import CONSTRAINED, GRADE_SCHEMA, RESPONSE_FORMAT, JudgeGrader, parse_grade
from evalkit.spec.dataset import load_cases
from evalkit.spec.matrix import Judge


@pytest.mark.parametrize("raw,grade", [
    ("Score: 4\nIt names the role.", 4),
    ("score = 2", 2),
    ('{"score": 5, "reason": "fine"}', 5),
    ("I would give it 3/5 overall.", 3),
    ("4\nbecause it is clear", 4),
    ("**2**", 2),
    ("The text is good.", None),
    ("1. It names the company. 2. It names the role.", None),
    ("Score: 7", None),
])
def test_a_grade_is_read_from_the_forms_judges_write(raw, grade):
    assert parse_grade(raw) == grade


@pytest.mark.parametrize("answer,grade", [('{"score": 3, "reason": "It invents a degree."}', 3),
                                          ('{"score":5,"reason":"It names the', 5)])  # cut at max_tokens
def test_a_constrained_answer_is_read(answer, grade):
    assert parse_grade(answer) == grade


def test_the_constraint_is_a_grade_from_one_to_five():
    assert GRADE_SCHEMA["properties"]["score"]["enum"] == [1, 2, 3, 4, 5]


class Fake(JudgeGrader):
    """A judge whose server is a list of replies: a string is an answer, an int an HTTP error."""

    def __init__(self, judge: Judge, replies: list[str | int], vllm: bool = True) -> None:
        super().__init__(judge)
        self.replies, self.vllm, self.bodies = list(replies), vllm, []

    def _is_vllm(self) -> bool:
        return self.vllm

    def _post(self, body: dict[str, Any]) -> str:
        self.bodies.append(body)
        r = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(r, int):
            raise urllib.error.HTTPError("http://judge/v1/chat/completions", r, "refused", None,  # type: ignore[arg-type]
                                         io.BytesIO(json.dumps({"error": {"message": "unknown field"}}).encode()))
        return r


def judge(**kw: Any) -> Judge:
    return Judge(endpoint="http://judge:8000", model="j", criteria={"fit": "Is it fit?"}, **kw)


@pytest.fixture(scope="module")
def item() -> GradedRequest:
    return GradedRequest(1, "w8a8", "Dear Ana, I am applying for the backend role.", "stop", load_cases()[0])


def test_a_vllm_judge_is_asked_for_the_score_form(item):
    g = Fake(judge(), ["Score: 4"])
    g.grade(item)
    assert g.bodies[0]["response_format"] == RESPONSE_FORMAT


def test_another_server_is_asked_plainly(item):
    g = Fake(judge(), ["Score: 4"], vllm=False)
    g.grade(item)
    assert "response_format" not in g.bodies[0]


@pytest.mark.parametrize("mode,vllm,constrained", [("on", False, True), ("off", True, False), ("auto", True, True)])
def test_the_setting_decides_when_it_is_not_auto(item, mode, vllm, constrained):
    g = Fake(judge(structured_output=mode), ["Score: 4"], vllm=vllm)
    g.grade(item)
    assert ("response_format" in g.bodies[0]) is constrained


def test_the_grade_says_it_was_constrained(item):
    s = Fake(judge(), ["Score: 4"]).grade(item)
    assert s.detail["criteria"]["fit"]["asked"] == CONSTRAINED


def test_a_refused_constraint_is_asked_again_plainly(item):
    g = Fake(judge(structured_output="on"), [400, "Score: 2"])
    assert g.grade(item).value == 2.0


def test_the_grade_says_the_server_refused_the_constraint(item):
    s = Fake(judge(structured_output="on"), [400, "Score: 2"]).grade(item)
    assert s.detail["criteria"]["fit"]["asked"].startswith("plain: the server refused the JSON schema")


def test_after_a_refusal_the_rest_are_asked_plainly(item):
    g = Fake(judge(structured_output="on"), [400, "Score: 2"])
    g.grade(item)
    g.grade(item)
    assert [("response_format" in b) for b in g.bodies] == [True, False, False]


def test_a_400_for_another_reason_stays_an_error(item):
    # the plain request is refused too: the prompt, not the constraint, was the problem
    g = Fake(judge(), [400])
    s = g.grade(item)
    assert s.detail["criteria"]["fit"]["error"].startswith("HTTP 400")


def test_a_400_for_another_reason_keeps_the_constraint(item):
    g = Fake(judge(), [400])
    g.grade(item)
    assert g.answer_form() == CONSTRAINED


def test_a_batch_is_graded_in_order_with_requests_in_flight(item):
    items = [GradedRequest(k, "w8a8", f"text {k}", "stop", item.case) for k in range(6)]
    g = Fake(judge(concurrency=3), ["Score: 3"])
    assert [s.value for s in g.grade_batch(items)] == [3.0] * 6


@pytest.mark.integration
def test_a_served_judge_that_answers_version_gets_the_constraint(item):
    from evalkit.testing.stub_server import StubConfig, StubServer

    cfg = StubConfig(fixed_text="Score: 4", ttft_ms=0, itl_ms=0, keep_bodies=True)
    with StubServer(cfg) as s:  # the stub answers /version as vLLM does
        JudgeGrader(Judge(endpoint=s.base_url, model="stub-model", criteria={"fit": "Is it fit?"})).grade(item)
    assert cfg.bodies[0]["response_format"] == RESPONSE_FORMAT


# --- real vLLM: the bundled SmolLM2-135M as the judge of the shipped labels ----------------------------------


@pytest.fixture(scope="module")
def served_calibration(tmp_path_factory) -> tuple[str, int]:
    """`graders calibrate --grader judge` against a real vLLM serving the bundled model, on the
    first 16 of rubrics/judge_labels.jsonl's 64 texts (2 criteria: 32 judge requests). The whole
    file takes the same path, 128 requests: 11 minutes on an AVX2-only processor."""
    from click.testing import CliRunner

    from evalkit.cli import cli
    from evalkit.engines.bundled import resolve_model
    from evalkit.engines.vllm_server import VLLMServer, vllm_distribution
    from evalkit.paths import PROJECT_DIR, cache_dir

    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    args = ["--max-model-len", "4096", "--enforce-eager", "--kv-cache-memory-bytes", str(400 * 2**20)]
    folder = tmp_path_factory.mktemp("judge")
    log, labels = folder / "server.log", folder / "labels.jsonl"
    shipped = (PROJECT_DIR / "rubrics" / "judge_labels.jsonl").read_text(encoding="utf-8").splitlines()
    labels.write_text("\n".join(shipped[:16]) + "\n", encoding="utf-8")
    with VLLMServer(resolve_model("bundled:smollm2-135m-instruct"), "smollm2", args, log, cache_dir=cache_dir()) as s:
        r = CliRunner().invoke(cli, ["graders", "calibrate", "--grader", "judge", "--judge-endpoint", s.base_url,
                                     "--judge-model", "smollm2", "--judge-max-tokens", "16", "--file", str(labels)])
    return r.output, r.exit_code


@pytest.mark.vllm
def test_a_served_small_model_judges_the_shipped_labels(served_calibration):
    assert served_calibration[1] == 0, served_calibration[0]


@pytest.mark.vllm
def test_a_served_small_models_kappa_is_given_with_its_interval_or_why_it_has_none(served_calibration):
    import re

    # on 16 texts a small judge may answer one way throughout: then kappa is undefined, and says so
    assert re.search(r"judge vs people \(labelled texts in .*\): (kappa [+-]\d\.\d\d \[[+-]\d\.\d\d, [+-]\d\.\d\d\]"
                     r"|kappa undefined \(n \d+: one rater used a single label throughout\))",
                     served_calibration[0]), served_calibration[0]


@pytest.mark.vllm
def test_a_served_small_model_gives_every_text_a_verdict(served_calibration):
    # constrained to {"score": N, ...}, no answer is left unparsed (unconstrained, none was parsable)
    assert "left out" not in served_calibration[0], served_calibration[0]


@pytest.mark.vllm
def test_a_served_small_models_confusion_matrix_is_printed(served_calibration):
    assert "rows: judge; columns: people" in served_calibration[0], served_calibration[0]
