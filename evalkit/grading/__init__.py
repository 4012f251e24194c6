"""Graders read the ledger and append grade rows; re-grading adds rows, never overwrites.

The public API for writing and running graders: `Grader` (scoring) and `Aggregate` (what its
grades become in reports, gates and margins) with their declaration types, and the functions that
find and run graders. Which graders exist is the registry's business (`registry.py`: built-ins by
import, plugins by entry point or `module:Class`). docs/plugins.md documents every hook.

May import: the root modules, `spec`, `ledger`. Never `measure`, `engines` or `execution`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..catalogue import CaseValue, Metric
from ..ledger import Ledger, dumps, utcnow
from ..spec.dataset import Case
from ..stats import mean
from .base import (
    Aggregate,
    CannedQuery,
    GradedRequest,
    Grader,
    GraderContext,
    Margin,
    Score,
    Threshold,
    paired_differences,
    pass_pct,
)
from .registry import add_path, available, can_grade, default_names, make_graders, register, resolve, view_columns
from .sample import GradeSample, sample_line

__all__ = ["Aggregate", "CannedQuery", "CaseValue", "GradeSample", "GradedRequest", "Grader", "GraderContext", "Margin",
           "Metric", "Score", "Threshold", "add_path", "available", "default_names", "grade_failures", "grade_run",
           "graded_requests", "make_graders", "mean", "paired_differences", "pass_pct", "refresh_view", "register",
           "resolve", "sample_line"]


def case_from_row(row: dict[str, Any]) -> Case:
    """A request row's case as the run had it (a ledger from before 0.3 kept the resume fields in
    columns of their own)."""
    if row.get("attributes_json"):
        attrs = json.loads(row["attributes_json"])
    else:
        attrs = {k: row[k] for k in ("task", "persona", "persona_title", "persona_description", "candidate",
                                     "formality") if row.get(k) is not None}
        if row.get("context_keys_json"):
            attrs["context_keys"] = json.loads(row["context_keys_json"])
    return Case.model_validate({
        "id": row["case_id"], "messages": json.loads(row["messages_json"]), "complexity": row.get("complexity"),
        "schema": row.get("schema_name"), "reference": row.get("reference"), "attributes": attrs,
        "schema_doc": json.loads(row["schema_json"]) if row.get("schema_json") else None,
    })


def graded_requests(ledger: Ledger, run_id: str) -> tuple[list[GradedRequest], dict[int, int]]:
    """Every successful, measured (non-warmup, final) request of a run, with its case."""
    # a trace's synthetic prompts have nothing to grade: timing only
    rows = [r for r in ledger.measured_requests(run_id, ok_only=True) if r["task"] != "trace"]
    rows.sort(key=lambda r: r["id"])
    cases: dict[str, Case] = {}
    items = []
    for row in rows:
        case = cases.get(row["case_id"]) or cases.setdefault(row["case_id"], case_from_row(row))
        items.append(GradedRequest(row["id"], row["variant"], row["text"] or "", row["finish_reason"], case,
                                   row["level"] or "main", row["concurrency"] or 1, row["repeat"],
                                   row.get("reasoning_text") or ""))
    return items, {r["id"]: r["repeat"] for r in rows}


def refresh_view(ledger: Ledger) -> None:
    """Datasette's `requests_joined` lists one column per registered grader."""
    ledger.define_requests_view(view_columns())


def _scores(g: Grader, todo: list[GradedRequest], items: list[GradedRequest], repeats: dict[int, int],
            baseline: str | None) -> list[tuple[GradedRequest, Score | BaseException]]:
    """Each item's score, or the exception its grader raised on it: a request grader that raises on
    a batch is asked again one item at a time, so one bad case costs its own grade only; a pair or
    run grader that raises fails every item it was to grade."""
    if g.kind == "request":
        try:
            return list(zip(todo, g.grade_batch(todo), strict=True))
        except Exception:  # noqa: BLE001 - a plugin's bug is data: find which items it fails on
            out: list[tuple[GradedRequest, Score | BaseException]] = []
            for i in todo:
                try:
                    out.append((i, g.grade(i)))
                except Exception as e:  # noqa: BLE001
                    out.append((i, e))
            return out
    try:  # per pair / per run: sees every output, grades the ones not yet graded
        all_scores = g.grade_outputs(items, repeats, baseline)
    except Exception as e:  # noqa: BLE001
        return [(i, e) for i in todo]
    return [(i, all_scores[i.request_id]) for i in todo if i.request_id in all_scores]


def _row(run_id: str, g: Grader, i: GradedRequest, s: Score | BaseException, now: str) -> dict[str, Any]:
    row = {"request_id": i.request_id, "run_id": run_id, "grader": g.name, "grader_version": g.version,
           "created_at": now}
    if isinstance(s, BaseException):
        return {**row, "value": None, "passed": None, "explanation": f"grader failed: {error_text(s)}",
                "detail_json": dumps({}), "error_class": type(s).__name__, "error": str(s)[:2000]}
    return {**row, "value": s.value, "passed": None if s.passed is None else int(s.passed),
            "explanation": s.explanation, "detail_json": dumps(s.detail)}


def error_text(e: BaseException) -> str:
    """`KeyError 'line_total'`: the class and the message, as one short phrase."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__} {msg}".strip()[:200]


def grade_run(ledger: Ledger, run_id: str, graders: list[Grader] | None = None,
              sample: GradeSample | None = None, retry_failed: bool = False) -> int:
    """Grade what each grader version has not graded yet in this run; returns rows added.
    ``sample``: only a stratified sample of the cases, recorded on the run (without: every
    request, and the run's sample record is cleared). A grader that raises on a request leaves an
    error grade for it (`grade_failures` reads them) and every other request is still graded;
    ``retry_failed`` grades those requests again."""
    ledger.require_run(run_id)
    graders = graders if graders is not None else make_graders()
    items, repeats = graded_requests(ledger, run_id)
    info = None
    if sample is not None:
        items, info = sample.choose(items)
    ledger.update_run(run_id, {"grade_sample_json": dumps(info) if info else None})
    baseline = ledger.baseline(run_id)
    for g in graders:  # graders that keep their context read this run's teacher-forced scores (divergence)
        if isinstance(getattr(g, "context", None), GraderContext):
            g.context.token_scores = functools.partial(ledger.token_scores, run_id)  # type: ignore[attr-defined]
    failed: dict[tuple[str, str], set[int]] = {}
    if retry_failed:
        for e in ledger.grade_errors(run_id):
            failed.setdefault((e["grader"], e["grader_version"]), set()).add(e["request_id"])
    n = 0
    for g in graders:
        done = ledger.graded_request_ids(run_id, g.name, g.version) - failed.get((g.name, g.version), set())
        mine = [i for i in items if can_grade(type(g), i.case)]  # a case without the fields it reads: not its
        todo = [i for i in mine if i.request_id not in done]
        if not todo:
            continue
        now = utcnow()
        rows = [_row(run_id, g, i, s, now) for i, s in _scores(g, todo, mine, repeats, baseline)]
        ledger.insert_grades(rows)
        n += len(rows)
    refresh_view(ledger)
    return n


def grade_failures(ledger: Ledger, run_id: str) -> list[str]:
    """One line per grader that failed on some requests of the run (its newest grade of them an
    error): `fieldmatch failed on 5 of 30 requests: KeyError 'line_total'; first: case r-07`.
    Counted in the ledger (`Ledger.grade_failure_counts`): no request is read."""
    failures, graded = ledger.grade_failure_counts(run_id)
    return [f"{f['grader']} failed on {f['n']} of {graded} requests: {f['error_class']} {f['error'] or ''}".rstrip()
            + (f" (and {f['kinds'] - 1} other error(s))" if f["kinds"] > 1 else "")
            + f"; first: case {f['case_id']} ({f['variant']})" for f in failures]
