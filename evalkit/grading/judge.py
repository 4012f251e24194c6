"""Optional LLM-as-judge: one rubric prompt per criterion, the judge's parsed 1-5 grade and its
raw answer stored. Off unless the matrix has a `judge:` section (e.g. a larger model on a GPU).

A vLLM judge is asked for a constrained answer (`response_format` JSON schema `{"score": 1-5,
"reason"}`), so even a small model answers in the form the grade is read from; another
OpenAI-compatible server is asked plainly, and one that refuses the constraint (HTTP 400) is asked
again without it. Each criterion's grade records how it was asked (`asked`). Parsing stays tolerant
either way. `response_format` is OpenAI's own parameter, so other servers know it too; vLLM's own
`structured_outputs` regex is not used: a regex xgrammar cannot compile falls to vLLM 0.32's guidance
backend, which rejects SmolLM2's own space token and answers HTTP 500 (docs/measured.md)."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..catalogue import Metric
from ..errors import UsageError
from ..redact import redact
from .base import Aggregate, GradedRequest, Grader, GraderContext, Margin, Score, Threshold
from .text import prose

GRADE = re.compile(r"(?i)\bscore\s*[:=]\s*([1-5])\b")
# also read, in this order: {"score": 4}, "4/5", an answer whose first line is the digit alone
LENIENT = (re.compile(r'(?i)"score"\s*:\s*"?([1-5])\b'), re.compile(r"\b([1-5])\s*/\s*5\b"),
           re.compile(r"^\s*\**([1-5])\**\s*\.?\s*(?:\n|$)"))
# what a constrained judge may write (OpenAI's `response_format`, which vLLM serves with xgrammar)
GRADE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "reason": {"type": "string"}},
    "required": ["score", "reason"], "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "judge_grade", "schema": GRADE_SCHEMA}}
CONSTRAINED = "constrained (response_format JSON schema)"
PROMPT = (
    "You grade one text written by an AI model for a resume platform.\n"
    "Criterion: {criterion}\n\nTask given to the model:\n{task}\n\nText to grade:\n{text}\n\n"
)
ANSWER_PLAIN = ("Answer with one line 'Score: N' (N from 1 = fails the criterion to 5 = fully meets it), then one "
                "short sentence of reasons.")
ANSWER_JSON = ('Answer in JSON: {"score": N, "reason": "..."}, N from 1 = fails the criterion to 5 = fully meets '
               "it, the reason one short sentence.")


def parse_grade(raw: str) -> int | None:
    """The 1-5 grade in a judge's answer: `Score: N` first, then the lenient forms; None if none."""
    for pat in (GRADE, *LENIENT):
        if m := pat.search(raw):
            return int(m.group(1))
    return None


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode("utf-8", "replace")
        msg = json.loads(body).get("error", body)
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    except (OSError, ValueError, AttributeError):
        msg = str(e)
    return redact(str(msg))[:200]


class JudgeAggregate(Aggregate):
    view_columns = (("judge_mean", "value"),)
    columns = (Metric("judge_mean", "judge /5", 2, "mean judge grade over criteria"),)
    thresholds = (Threshold("judge_mean", "judge_mean", "min", "minimum mean judge grade, 1-5"),)
    margins = (Margin("judge", "abs", True, "mean judge grade, candidate minus baseline"),)


class JudgeGrader(Grader):
    name = "judge"
    version = "2"  # 2: vLLM judges are asked for a constrained answer
    default = False  # only when the run's matrix has a `judge:` section
    description = "an LLM judge (the matrix's `judge:` endpoint) grades each criterion 1-5"
    aggregate = JudgeAggregate

    @classmethod
    def from_context(cls, ctx: GraderContext) -> JudgeGrader:
        if ctx.judge is None:
            raise UsageError("grader 'judge' needs a `judge:` section in the run's matrix")
        return cls(ctx.judge)

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self._lock = threading.Lock()
        self._form: str | None = None  # how answers are asked for: CONSTRAINED or "plain (why)"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.judge.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(self.judge.api_key_env, '')}"
        return headers

    def _is_vllm(self) -> bool:
        """vLLM answers GET /version with its version; OpenAI and most others have no such path."""
        req = urllib.request.Request(f"{self.judge.endpoint}/version", headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return isinstance(json.loads(r.read()).get("version"), str)
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return False

    def answer_form(self) -> str:
        """Constrained or plain, decided on the first request (the /version probe) and kept."""
        with self._lock:
            if self._form is None:
                mode = self.judge.structured_output
                if mode == "off":
                    self._form = "plain (judge.structured_output: off)"
                elif mode == "on" or self._is_vllm():
                    self._form = CONSTRAINED
                else:
                    self._form = "plain (not a vLLM server: no /version)"
            return self._form

    def _post(self, body: dict[str, Any]) -> str:
        req = urllib.request.Request(f"{self.judge.endpoint}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers=self._headers())
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["choices"][0]["message"]["content"] or ""

    def _body(self, prompt: str, constrained: bool) -> dict[str, Any]:
        j = self.judge
        content = prompt + (ANSWER_JSON if constrained else ANSWER_PLAIN)
        body = {"model": j.model, "messages": [{"role": "user", "content": content}], "max_tokens": j.max_tokens,
                "temperature": 0.0}
        return {**body, "response_format": RESPONSE_FORMAT} if constrained else body

    def _ask(self, prompt: str) -> tuple[str, str]:
        """The judge's answer and how it was asked for. A constrained request refused with HTTP 400
        is sent again plainly; when that one is answered, the refusal was the constraint's, and the
        rest are asked plainly too (a 400 for another reason, e.g. too long a prompt, stays an error)."""
        form = self.answer_form()
        if form != CONSTRAINED:
            return self._post(self._body(prompt, False)), form
        try:
            return self._post(self._body(prompt, True)), form
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            why = _error_text(e)
        raw = self._post(self._body(prompt, False))
        with self._lock:
            self._form = f"plain: the server refused the JSON schema response_format (HTTP 400: {why})"
            return raw, self._form

    def grade_batch(self, items: list[GradedRequest]) -> list[Score]:
        if len(items) < 2 or self.judge.concurrency < 2:
            return [self.grade(i) for i in items]
        with ThreadPoolExecutor(min(self.judge.concurrency, len(items)), thread_name_prefix="judge") as pool:
            return list(pool.map(self.grade, items))

    def grade(self, item: GradedRequest) -> Score:
        task = item.case.messages[-1].content[:1500]
        text = prose(item.text)
        if self.judge.see_reasoning and item.reasoning:  # the thinking beside the answer, marked as such
            text = f"(the model's reasoning before its answer)\n{item.reasoning[:3000]}\n\n(its answer)\n{text}"
        per: dict[str, Any] = {}
        for name, criterion in self.judge.criteria.items():
            try:
                raw, asked = self._ask(PROMPT.format(criterion=criterion, task=task, text=text))
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
                why = f"HTTP {e.code}: {_error_text(e)}" if isinstance(e, urllib.error.HTTPError) else str(e)
                per[name] = {"grade": None, "raw": None, "error": redact(why)[:300]}
                continue
            per[name] = {"grade": parse_grade(raw), "raw": raw[:2000], "asked": asked}
        grades = [v["grade"] for v in per.values() if v["grade"] is not None]
        if not grades:
            errors = [v["error"] for v in per.values() if v.get("error")]
            why = f": {errors[0]}" if errors else ""
            return Score(0.0, None, f"judge gave no parsable grade{why}", {"criteria": per})
        mean = sum(grades) / len(grades)
        expl = ", ".join(f"{k} {v['grade'] if v['grade'] is not None else '?'}" for k, v in per.items())
        return Score(mean, mean >= 3, f"judge mean {mean:.1f}/5 ({expl})", {"criteria": per})


def judge_of_run(matrix_json: str | None) -> Any:
    """The judge settings a run's matrix had, if any (only that section is read back, so a stored
    matrix from an older evalkit still gives its judge)."""
    from ..spec.matrix import Judge

    judge = json.loads(matrix_json or "{}").get("judge")
    return Judge.model_validate(judge) if judge else None


def context_of_run(matrix_json: str | None) -> GraderContext:
    """What a run's stored matrix tells its graders: its judge, and whether it compares outputs
    across load levels."""
    gen = json.loads(matrix_json or "{}").get("generation") or {}
    return GraderContext(judge=judge_of_run(matrix_json), quality_under_load=bool(gen.get("quality_under_load")))
