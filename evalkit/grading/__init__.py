"""Graders read the ledger and append grade rows; re-grading adds rows, never overwrites."""

from __future__ import annotations

import json

from sqlite_utils import Database

from ..dataset import Case
from ..errors import UsageError
from ..ledger import dumps, utcnow
from .base import GradedRequest, Grader, Score
from .schema import SchemaGrader

GRADERS: dict[str, type] = {"schema": SchemaGrader}

__all__ = ["GRADERS", "GradedRequest", "Grader", "Score", "grade_run", "make_graders"]


def make_graders(names: list[str] | None = None) -> list[Grader]:
    names = names or list(GRADERS)
    unknown = [n for n in names if n not in GRADERS]
    if unknown:
        raise UsageError(f"unknown grader(s): {', '.join(unknown)} (known: {', '.join(GRADERS)})")
    return [GRADERS[n]() for n in names]


def _case_from_row(row: dict) -> Case:
    return Case.model_validate({
        "id": row["case_id"], "task": row["task"], "persona": row["persona"],
        "candidate": row["candidate"], "complexity": row["complexity"], "formality": row["formality"],
        "schema": row["schema_name"], "context_keys": json.loads(row["context_keys_json"]),
        "messages": json.loads(row["messages_json"]),
    })


def grade_run(db: Database, run_id: str, graders: list[Grader] | None = None) -> int:
    """Grade every successful request of a run that this grader version has not graded yet."""
    graders = graders or make_graders()
    dhash = db["runs"].get(run_id)["dataset_hash"]
    rows = list(db.query(
        """select r.id as request_id, r.variant, r.text, r.finish_reason, r.case_id, c.*
           from requests r join cases c on c.id = r.case_id and c.dataset_hash = ?
           where r.run_id = ? and r.error_class is null and r.is_warmup = 0 order by r.id""",
        [dhash, run_id],
    ))
    n = 0
    for g in graders:
        done = {r["request_id"] for r in db.query(
            "select request_id from grades where run_id = ? and grader = ? and grader_version = ?",
            [run_id, g.name, g.version])}
        out = []
        for row in rows:
            if row["request_id"] in done:
                continue
            item = GradedRequest(row["request_id"], row["variant"], row["text"] or "",
                                 row["finish_reason"], _case_from_row(row))
            s = g.grade(item)
            out.append({
                "request_id": item.request_id, "run_id": run_id, "grader": g.name,
                "grader_version": g.version, "value": s.value,
                "passed": None if s.passed is None else int(s.passed),
                "explanation": s.explanation, "detail_json": dumps(s.detail), "created_at": utcnow(),
            })
        if out:
            db["grades"].insert_all(out)
        n += len(out)
    return n
