"""The `token_scores` table (m018): teacher-forced scoring requests, one row each. Kept apart from
`requests` so no scoring request ever enters a latency statistic, and apart from `store.py` so the
Ledger's core stays small: `Ledger` takes these methods as a mixin."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from ..errors import LedgerWriteError

# columns a reader gets without the (large) per-token arrays
SUMMARY_COLUMNS = ("id", "run_id", "variant", "replica", "case_id", "answer_request_id", "answer_variant", "kind",
                   "status", "error_class", "error", "http_status", "started_at", "mono_start_ms", "e2e_ms", "concurrency",
                   "top_k",
                   "prompt_tokens", "prefix_tokens", "answer_tokens", "temperature", "text", "finish_reason")


class TokenScoresMixin:
    """Reads and writes of teacher-forced scores. Needs the Ledger's private ``_db``."""

    _db: Database
    path: Path

    def insert_token_score(self, row: dict[str, Any]) -> int:
        try:
            return int(self._db["token_scores"].insert(row).last_pk)
        except sqlite3.OperationalError as e:  # a full disk: one line naming the ledger, as every write
            raise LedgerWriteError(f"{self.path}: cannot write the ledger ({e})") from None

    def token_scores(self, run_id: str, variant: str | None = None, *, with_tokens: bool = True,
                     ok_only: bool = False) -> list[dict[str, Any]]:
        """A run's scoring rows in the order they were written; with ``with_tokens`` each carries
        ``tokens`` (the parsed per-token arrays, or None)."""
        cols = "*" if with_tokens else ", ".join(SUMMARY_COLUMNS)
        where, params = ["run_id = ?"], [run_id]
        if variant is not None:
            where.append("variant = ?")
            params.append(variant)
        if ok_only:
            where.append("status = 'ok'")
        rows = list(self._db.query(f"select {cols} from token_scores where {' and '.join(where)} order by id", params))
        if with_tokens:
            for r in rows:
                r["tokens"] = json.loads(r.pop("tokens_json")) if r.get("tokens_json") else None
        return rows

    def scored_cases(self, run_id: str, variant: str, kind: str) -> set[str]:
        """Cases a variant has already scored successfully in one kind of pass (a resume skips them)."""
        return {r["case_id"] for r in self._db.query(
            "select distinct case_id from token_scores where run_id = ? and variant = ? and kind = ? and status = 'ok'",
            [run_id, variant, kind])}

    def choice_scores(self, run_id: str) -> list[dict[str, Any]]:
        """Each option's teacher-forced score of a choice item (`execution/choice_scoring.py`): variant,
        case, option index, its summed log-probability and its token count."""
        out = []
        for r in self._db.query("select variant, case_id, kind, tokens_json from token_scores where run_id = ? and "
                                "kind like 'choice:%' and status = 'ok' order by id", [run_id]):
            t = json.loads(r["tokens_json"] or "{}")
            out.append({"variant": r["variant"], "case_id": r["case_id"], "option": int(r["kind"].split(":")[1]),
                        "logprob": float(sum(t.get("lp") or [])), "tokens": len(t.get("ids") or [])})
        return out

    def copy_token_scores(self, rows: list[dict[str, Any]]) -> int:
        """Rows from another ledger (`ledger merge`), ids renumbered; returns how many."""
        rows = [{k: v for k, v in r.items() if k != "id"} for r in rows]
        if rows:
            self._db["token_scores"].insert_all(rows, alter=True)
        return len(rows)
