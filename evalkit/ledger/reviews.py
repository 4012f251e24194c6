"""The `reviews` table (m021): people's verdicts on a baseline/candidate pair of answers, written
by `evalkit browse --review`. Rows are only ever added; the newest per reviewer, case and candidate
counts. A mixin of `Ledger` (needs its private ``_db``), with the few reads the comparison pages
need that no other part of evalkit does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from ..errors import UsageError
from .writes import _write, utcnow

# what a reviewer can say about a pair, in the order the form offers them
VERDICTS = ("same", "candidate_better", "candidate_worse", "both_fail")
REVIEW_FIELDS = ("run_id", "case_id", "baseline", "candidate", "baseline_request_id", "candidate_request_id",
                 "reviewer", "verdict", "comment")


class ReviewsMixin:
    """Reads and writes of reviews. Needs the Ledger's private ``_db``."""

    _db: Database
    path: Path

    @_write
    def record_review(self, row: dict[str, Any]) -> int:
        """One review; returns its id. A verdict outside `VERDICTS` or a missing reviewer is a
        usage error (nothing is written)."""
        if row.get("verdict") not in VERDICTS:
            raise UsageError(f"review verdict must be one of {', '.join(VERDICTS)}, not {row.get('verdict')!r}")
        if not str(row.get("reviewer") or "").strip():
            raise UsageError("a review needs a reviewer's name")
        clean = {k: row.get(k) for k in REVIEW_FIELDS}
        clean["comment"] = (clean["comment"] or "").strip()[:4000] or None
        clean["created_at"] = utcnow()
        return int(self._db["reviews"].insert(clean).last_pk)

    def reviews(self, run_id: str, *, latest: bool = True) -> list[dict[str, Any]]:
        """A run's reviews in the order written; ``latest``: only each reviewer's newest per case
        and candidate."""
        rows = list(self._db.query("select * from reviews where run_id = ? order by id", [run_id]))
        if not latest:
            return rows
        newest: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in rows:
            newest[(r["reviewer"], r["case_id"], r["candidate"])] = r
        return sorted(newest.values(), key=lambda r: r["id"])

    def answer_keys(self, ids: list[int]) -> dict[int, tuple[str, str, str]]:
        """request id -> (run, variant, case) of those of ``ids`` that exist (a review's check)."""
        if not ids:
            return {}
        return {r["id"]: (r["run_id"], r["variant"], r["case_id"]) for r in self._db.query(
            f"select id, run_id, variant, case_id from requests where id in ({', '.join('?' * len(ids))})", list(ids))}

    def token_score_rows(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        """Teacher-forced scoring rows by id, each with ``tokens`` parsed (a case page reads two)."""
        if not ids:
            return {}
        rows = self._db.query(f"select * from token_scores where id in ({', '.join('?' * len(ids))})", list(ids))
        out = {}
        for r in rows:
            r["tokens"] = json.loads(r.pop("tokens_json")) if r.get("tokens_json") else None
            out[r["id"]] = r
        return out
