"""The rows a report reads: each measured request (final attempt, not a warm-up) with its case's
fields, its newest grades and its output rate, read once per report and without the texts or the
columns no report reads (a million rows of them would not fit)."""

from __future__ import annotations

import gc
import json
from typing import Any

from ..ledger import Ledger

_NO_GRADES: dict[str, Any] = {}  # shared by every ungraded row: a large run's are most
# Request text columns with few distinct values: one string object per value, not one per row.
_SHARED = ("run_id", "variant", "case_id", "level", "finish_reason", "error_class", "srv_method", "timestamp_source")


class Rows(list):  # type: ignore[type-arg]
    """A run's report rows. A list, so every reader works on it and on any slice of it, plus a
    memo for what several readers derive from the same rows (see `selection`)."""

    memo: dict[str, Any]

    def __init__(self, rows: Any = ()) -> None:
        super().__init__(rows)
        self.memo = {}


def request_rows(ledger: Ledger, run_id: str) -> Rows:
    """Measured requests joined with their case and latest grades, lean (see `Ledger.iter_measured`)."""
    grades = ledger.latest_grades(run_id)
    # each case's fields once, attached to its rows: a million rows share a few hundred values
    # instead of each carrying its own copy of the case's strings (its attributes JSON is ~500 bytes)
    cases = ledger.case_fields(run_id, lean=True)
    parsed: dict[str | None, dict[str, Any]] = {}  # one attributes dict per case, shared by its rows
    # A million acyclic dicts trigger the cyclic collector again and again while they are made and
    # every later pass pays for scanning them: collect once, then leave them out of collections.
    enabled = gc.isenabled()
    gc.disable()
    try:
        rows = Rows(ledger.iter_measured(run_id, lean=True, with_cases=False))
        canon: dict[str, str] = {}
        shared = [k for k in _SHARED if rows and k in rows[0]]
        for r in rows:
            del r["_case"]
            r.update(cases[r["case_id"]])
            for k in shared:
                if (v := r[k]) is not None:
                    r[k] = canon.setdefault(v, v)
            r["grades"] = grades.get(r["id"], _NO_GRADES)
            raw = r.get("attributes_json")
            if raw:
                attrs = parsed.get(raw)
                if attrs is None:
                    attrs = parsed[raw] = json.loads(raw)
            else:
                attrs = {k: r[k] for k in ("task", "persona", "candidate", "formality") if r.get(k) is not None}
            r["attributes"] = attrs
            r["out_tps"] = (r["completion_tokens"] / (r["e2e_ms"] / 1000.0)
                            if r["completion_tokens"] and r["e2e_ms"] and r["error_class"] is None else None)
    finally:
        if enabled:
            gc.enable()
    if len(rows) > 50_000:
        gc.freeze()  # the rows live as long as the report (refcounts still free them): later passes skip them
    return rows
