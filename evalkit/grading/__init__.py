"""Graders read the ledger and append grade rows; re-grading adds rows, never overwrites.

Per-request graders: schema, persona, formality (and judge when the matrix names one).
Run-level grader: drift (needs the baseline's outputs for the same cases).
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from ..dataset import Case
from ..errors import UsageError
from ..ledger import dumps, utcnow
from .base import GradedRequest, Grader, Score
from .schema import SchemaGrader

GRADER_NAMES = ("schema", "persona", "formality", "drift", "judge")
DEFAULT_GRADERS = ("schema", "persona", "formality", "drift")

__all__ = ["DEFAULT_GRADERS", "GRADER_NAMES", "GradedRequest", "Grader", "Score", "grade_run", "make_graders"]


def make_graders(names: list[str] | None = None, judge: Any = None) -> list[Any]:
    names = list(names or DEFAULT_GRADERS)
    unknown = [n for n in names if n not in GRADER_NAMES]
    if unknown:
        raise UsageError(f"unknown grader(s): {', '.join(unknown)} (known: {', '.join(GRADER_NAMES)})")
    out: list[Any] = []
    for n in names:
        if n == "schema":
            out.append(SchemaGrader())
        elif n == "formality":
            from .formality import FormalityGrader

            out.append(FormalityGrader())
        elif n == "persona":
            from .embeddings import embed
            from .persona import PersonaGrader

            out.append(PersonaGrader(embed=embed))
        elif n == "drift":
            from .drift import DriftGrader
            from .embeddings import embed

            out.append(DriftGrader(embed))
        elif n == "judge":
            if judge is None:
                raise UsageError("grader 'judge' needs a `judge:` section in the run's matrix")
            from .judge import JudgeGrader

            out.append(JudgeGrader(judge))
    return out


def case_from_row(row: dict) -> Case:
    return Case.model_validate({
        "id": row["case_id"], "task": row["task"], "persona": row["persona"],
        "persona_title": row.get("persona_title") or "", "persona_description": row.get("persona_description") or "",
        "candidate": row["candidate"], "complexity": row["complexity"], "formality": row["formality"],
        "schema": row["schema_name"], "context_keys": json.loads(row["context_keys_json"]),
        "messages": json.loads(row["messages_json"]),
    })


def graded_requests(db: Database, run_id: str) -> tuple[list[GradedRequest], dict[int, int]]:
    """Every successful, measured (non-warmup, final) request of a run, with its case."""
    dhash = db["runs"].get(run_id)["dataset_hash"]
    rows = list(db.query(
        """select r.id as request_id, r.variant, r.text, r.finish_reason, r.case_id, r.repeat, c.*
           from requests r join cases c on c.id = r.case_id and c.dataset_hash = ?
           where r.run_id = ? and r.error_class is null and r.is_warmup = 0 and r.final = 1
           order by r.id""",
        [dhash, run_id],
    ))
    cases: dict[str, Case] = {}
    items = []
    for row in rows:
        case = cases.get(row["case_id"]) or cases.setdefault(row["case_id"], case_from_row(row))
        items.append(GradedRequest(row["request_id"], row["variant"], row["text"] or "", row["finish_reason"], case))
    return items, {r["request_id"]: r["repeat"] for r in rows}


def grade_run(db: Database, run_id: str, graders: list[Any] | None = None) -> int:
    """Grade what each grader version has not graded yet in this run; returns rows added."""
    if not db["runs"].count_where("id = ?", [run_id]):
        raise UsageError(f"no run '{run_id}' in the ledger")
    graders = graders if graders is not None else make_graders()
    items, repeats = graded_requests(db, run_id)
    baseline = next((v["name"] for v in db.query(
        "select name from variants where run_id = ? and is_baseline = 1", [run_id])), None)
    n = 0
    for g in graders:
        done = {r["request_id"] for r in db.query(
            "select request_id from grades where run_id = ? and grader = ? and grader_version = ?",
            [run_id, g.name, g.version])}
        todo = [i for i in items if i.request_id not in done]
        if not todo:
            continue
        if hasattr(g, "grade_run"):
            if baseline is None:
                continue
            all_scores = g.grade_run(items, repeats, baseline)
            scores = [(i, all_scores[i.request_id]) for i in todo if i.request_id in all_scores]
        elif hasattr(g, "grade_batch"):
            scores = list(zip(todo, g.grade_batch(todo), strict=True))
        else:
            scores = [(i, g.grade(i)) for i in todo]
        now = utcnow()
        db["grades"].insert_all([
            {"request_id": i.request_id, "run_id": run_id, "grader": g.name, "grader_version": g.version,
             "value": s.value, "passed": None if s.passed is None else int(s.passed),
             "explanation": s.explanation, "detail_json": dumps(s.detail), "created_at": now}
            for i, s in scores
        ])
        n += len(scores)
    return n
