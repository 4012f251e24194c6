"""JSON Schema adherence: does the output parse, and does it validate? Names the failing path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from ..catalogue import PASS_PCT_SQL, Metric
from ..spec.output_schemas import load_schema
from .base import Aggregate, CannedQuery, GradedRequest, Grader, Margin, Score, Threshold, pass_pct


def _path(parts: object) -> str:
    return "/" + "/".join(str(p) for p in parts)  # type: ignore[union-attr]


class SchemaAggregate(Aggregate):
    columns = (Metric("schema_pass_pct", "schema %", 0, "share of outputs valid against their schema", "%"),)
    thresholds = (Threshold("schema_pass", "schema_pass_pct", "min", "minimum share of outputs valid against their "
                            "schema, 0-1", scale=100.0),)
    margins = (Margin("schema_pass", "pp", True, "schema pass rate, candidate minus baseline, percentage points"),)
    view_columns = (("schema_passed", "passed"),)
    canned_queries = (CannedQuery("schema_failures", "Outputs that failed their JSON Schema", "failures"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"schema_pass_pct": pass_pct(grades), "schema_graded": len(grades)}

    @classmethod
    def summary_sql(cls) -> dict[str, str]:
        return {"schema_pass_pct": PASS_PCT_SQL, "schema_graded": "count(*)"}


class SchemaGrader(Grader):
    name = "schema"
    version = "1"
    description = "the output parses as JSON and validates against the case's JSON Schema"
    requires = ("schema",)
    aggregate = SchemaAggregate

    @classmethod
    def validate_rubrics(cls, rubrics: Path) -> str:
        from ..spec.output_schemas import known_schema_names, load_schema

        names = sorted(known_schema_names(rubrics / "schemas"))
        for n in names:
            load_schema(n, rubrics / "schemas")
        return f"schemas: {', '.join(names)}"

    def grade(self, item: GradedRequest) -> Score:
        schema = item.case.schema_doc or load_schema(item.case.schema_name)  # a ledger from before 0.3: by name
        try:
            obj = json.loads(item.text)
        except json.JSONDecodeError as e:
            why = "truncated at max_tokens" if item.finish_reason == "length" else "not valid JSON"
            return Score(0.0, False, f"{why}: {e.msg} at char {e.pos}",
                         {"schema": item.case.schema_name, "parse_error": e.msg, "pos": e.pos,
                          "finish_reason": item.finish_reason, "errors": []})
        errors = sorted(Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
        detail = {
            "schema": item.case.schema_name,
            "finish_reason": item.finish_reason,
            "errors": [{"path": _path(e.absolute_path), "message": e.message[:300]} for e in errors],
        }
        if not errors:
            return Score(1.0, True, f"valid {item.case.schema_name}", detail)
        first = detail["errors"][0]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return Score(0.0, False, f"{first['path']}: {first['message']}{more}", detail)
