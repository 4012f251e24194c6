"""A tiny third-party grader: how many words an output has, and whether it is under 120."""

from __future__ import annotations

from typing import Any

from evalkit.grading.base import GradedRequest, Grader, Score, SummaryColumn, pass_pct
from evalkit.stats import mean


class WordCountGrader(Grader):
    name = "wordcount"
    version = "1"
    default = False
    description = "number of words in the output"
    view_columns = (("word_count", "value"),)
    summary_columns = (SummaryColumn("wordcount_mean", "words", 0, "mean words per output"),
                       SummaryColumn("wordcount_short_pct", "≤120 words %", 0, "share under 120 words"))

    def grade(self, item: GradedRequest) -> Score:
        n = len(item.text.split())
        return Score(float(n), n <= 120, f"{n} words", {"words": n})

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"wordcount_mean": mean([g["value"] for g in grades]), "wordcount_short_pct": pass_pct(grades)}
