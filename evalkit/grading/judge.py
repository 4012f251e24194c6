"""Optional LLM-as-judge: one rubric prompt per criterion, the judge's parsed 1-5 grade and its
raw answer stored. Off unless the matrix has a `judge:` section (e.g. a larger model on a GPU)."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any

from ..catalogue import Metric
from ..errors import UsageError
from ..redact import redact
from .base import Aggregate, GradedRequest, Grader, GraderContext, Margin, Score, Threshold
from .text import prose

GRADE = re.compile(r"(?i)\bscore\s*[:=]\s*([1-5])\b")
PROMPT = (
    "You grade one text written by an AI model for a resume platform.\n"
    "Criterion: {criterion}\n\nTask given to the model:\n{task}\n\nText to grade:\n{text}\n\n"
    "Answer with one line 'Score: N' (N from 1 = fails the criterion to 5 = fully meets it), then one "
    "short sentence of reasons."
)


class JudgeAggregate(Aggregate):
    view_columns = (("judge_mean", "value"),)
    columns = (Metric("judge_mean", "judge /5", 2, "mean judge grade over criteria"),)
    thresholds = (Threshold("judge_mean", "judge_mean", "min", "minimum mean judge grade, 1-5"),)
    margins = (Margin("judge", "abs", True, "mean judge grade, candidate minus baseline"),)


class JudgeGrader(Grader):
    name = "judge"
    version = "1"
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

    def _ask(self, prompt: str) -> str:
        j = self.judge
        headers = {"Content-Type": "application/json"}
        if j.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(j.api_key_env, '')}"
        body = json.dumps({"model": j.model, "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": j.max_tokens, "temperature": 0.0}).encode()
        req = urllib.request.Request(f"{j.endpoint}/v1/chat/completions", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["choices"][0]["message"]["content"] or ""

    def grade(self, item: GradedRequest) -> Score:
        task = item.case.messages[-1].content[:1500]
        per: dict[str, Any] = {}
        for name, criterion in self.judge.criteria.items():
            try:
                raw = self._ask(PROMPT.format(criterion=criterion, task=task, text=prose(item.text)))
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                per[name] = {"grade": None, "raw": None, "error": redact(str(e))[:300]}
                continue
            m = GRADE.search(raw)
            per[name] = {"grade": int(m.group(1)) if m else None, "raw": raw[:2000]}
        grades = [v["grade"] for v in per.values() if v["grade"] is not None]
        if not grades:
            return Score(0.0, None, "judge gave no parsable grade", {"criteria": per})
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
