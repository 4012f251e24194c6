"""The rows a report reads: each measured request (final attempt, not a warm-up) with its case's
fields, its newest grades and its output rate, read once per report and without the texts (the
report never reads them; a million rows of them would not fit)."""

from __future__ import annotations

import json
from typing import Any

from ..ledger import Ledger


def request_rows(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """Measured requests joined with their case and latest grades, lean (`Ledger.HEAVY_FIELDS` left out)."""
    grades = ledger.latest_grades(run_id)
    parsed: dict[str | None, dict[str, Any]] = {}  # one attributes dict per case, shared by its rows
    rows = ledger.measured_requests(run_id, lean=True)
    for r in rows:
        r["grades"] = grades.get(r["id"], {})
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
    return rows
