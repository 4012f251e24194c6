"""A grader of this workload's own: how long each reply is (no package, no install: the matrix
names it as `replylen:ReplyLength`)."""

from __future__ import annotations

import json
from typing import Any

from evalkit.grading import Aggregate, GradedRequest, Grader, Margin, Metric, Score, Threshold, mean, pass_pct


class ReplyLengthAggregate(Aggregate):
    columns = (Metric("reply_words_mean", "reply words", 0, "mean words per reply", "words"),
               Metric("reply_short_pct", "≤ 80 words %", 0, "replies of at most 80 words", "%"))
    thresholds = (Threshold("reply_words_mean", "reply_words_mean", "max", "maximum mean words per reply"),)
    margins = (Margin("reply_words", "abs", False, "words per reply, candidate minus baseline"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"reply_words_mean": mean([g["value"] for g in grades]), "reply_short_pct": pass_pct(grades)}


class ReplyLength(Grader):
    name = "replylen"
    version = "1"
    default = False
    description = "words in the reply field"
    requires = ("schema",)  # it reads the JSON reply
    aggregate = ReplyLengthAggregate

    def grade(self, item: GradedRequest) -> Score:
        try:
            reply = str(json.loads(item.text).get("reply", ""))
        except (ValueError, AttributeError):
            return Score(0.0, False, "not a JSON object with a reply")
        n = len(reply.split())
        return Score(float(n), n <= 80, f"{n} words")
