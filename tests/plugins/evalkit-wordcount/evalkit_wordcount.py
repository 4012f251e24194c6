"""A tiny third-party grader: how many words an output has, and whether it is under 120.

Everything evalkit shows about it comes from these declarations: the report columns, the
threshold `evalkit check --threshold wordcount_mean=...` takes, the margin, and the canned query
Datasette lists. Nothing in evalkit itself names it."""

from __future__ import annotations

from typing import Any

from evalkit.grading import Aggregate, CannedQuery, GradedRequest, Grader, Margin, Metric, Score, Threshold, mean, pass_pct


class WordCountAggregate(Aggregate):
    columns = (Metric("wordcount_mean", "words", 0, "mean words per output", "words"),
               Metric("wordcount_short_pct", "≤120 words %", 0, "share under 120 words", "%"))
    thresholds = (Threshold("wordcount_mean", "wordcount_mean", "max", "maximum mean words per output"),)
    margins = (Margin("wordcount", "abs", False, "words per output, candidate minus baseline"),)
    view_columns = (("word_count", "value"),)
    canned_queries = (CannedQuery("longest_outputs", "The wordiest outputs", "highest", "word_count"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"wordcount_mean": mean([g["value"] for g in grades]), "wordcount_short_pct": pass_pct(grades)}


class WordCountGrader(Grader):
    name = "wordcount"
    version = "1"
    default = False
    description = "number of words in the output"
    aggregate = WordCountAggregate

    def grade(self, item: GradedRequest) -> Score:
        n = len(item.text.split())
        return Score(float(n), n <= 120, f"{n} words", {"words": n})
