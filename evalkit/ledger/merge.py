"""Merge ledgers made apart (other machines, other days) into one: each source is first migrated
to this evalkit's schema, run ids stay as they are (distinct runs stay distinct), and a run that
was resumed in two places is de-duplicated by (variant, case, repeat, level): the first final row
for a key wins, with its grades. People's reviews follow the answers they read, one row per
submission however many inputs hold it, written last in the order they were made (the newest per
reviewer counts).

The inputs are only read: opened read-only (never migrated, never switched to WAL), a source of an
older schema read through a migrated copy made with the backup API. The output is built in a file
beside `-o` and renamed into place when it is whole (`files.new_database`): a kill leaves either no
`-o` or the whole merge, and a `-o` whose `-wal`/`-shm`/`-journal` is left over is refused first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import LedgerError, OldLedgerSchema, UsageError
from .files import beside, copy_ledger, new_database, refuse_leftovers, remove_database
from .opening import open_ledger
from .store import Ledger

ORDER = ("runs", "hosts", "variants", "replicas", "cases")  # tables keyed by natural ids


# one review submission, whichever inputs hold a copy of it (a ledger copied, then merged back)
REVIEW_KEY = ("run_id", "case_id", "baseline", "candidate", "reviewer", "created_at", "verdict", "comment")


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["run_id"], r["variant"], r["case_id"], r["repeat"], r["level"] or "main")


def _merge_reviews(dst: Ledger, reviews: list[dict[str, Any]], counts: dict[str, int]) -> None:
    """The inputs' reviews, one row per submission, in the order they were made: `Ledger.reviews`
    takes a reviewer's newest by id, and ids follow the inputs' order otherwise."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in reviews:
        kept.setdefault(tuple(r[k] for k in REVIEW_KEY), r)
    rows = sorted(kept.values(), key=lambda r: (r["created_at"] or "", r["run_id"], r["case_id"]))
    if rows:
        dst._db["reviews"].insert_all(rows, alter=True)
    counts["reviews"] = len(rows)
    counts["reviews_duplicates_dropped"] = len(reviews) - len(rows)


@contextmanager
def read_source(path: Path, scratch: Path) -> Iterator[Ledger]:
    """A merge input, read without writing it: read-only when it has this evalkit's schema, else a
    migrated copy made beside ``scratch`` (the output, whose folder is writable; removed afterwards)."""
    try:
        led = open_ledger(path, create=False, read_only=True)
    except OldLedgerSchema:
        copy = copy_ledger(path, beside(scratch, f"{path.stem}-migrating"))
        try:
            with open_ledger(copy, create=False) as led:
                yield led
        finally:
            remove_database(copy)
        return
    with led:
        yield led


def merge_ledgers(sources: list[Path], out: Path) -> dict[str, int]:
    if len(sources) < 2:
        raise UsageError("ledger merge: give at least two ledgers")
    for s in sources:
        if not s.exists():
            raise LedgerError(f"{s}: ledger not found")
        if out.exists() and s.resolve() == out.resolve():
            raise UsageError("ledger merge: the output must not be one of the inputs")
    if out.exists():
        raise UsageError(f"ledger merge: {out} exists; choose a new -o file")
    refuse_leftovers(out, "ledger merge")
    counts = {"runs": 0, "requests": 0, "duplicates_dropped": 0, "grades": 0, "server_samples": 0}
    with new_database(out, "ledger merge") as tmp, open_ledger(tmp) as dst:
        seen: set[tuple[Any, ...]] = set()
        reviews: list[dict[str, Any]] = []
        for path in sources:
            with read_source(path, out) as src:
                reviews += _merge_one(src, dst, seen, counts)
        with dst._db.conn:
            _merge_reviews(dst, reviews, counts)
        dst.close()  # closed before the file is renamed into place
    return counts


def _merge_one(src: Ledger, dst: Ledger, seen: set[tuple[Any, ...]], counts: dict[str, int]
               ) -> list[dict[str, Any]]:
    """Copies one input; returns its reviews, request ids mapped to the merged ledger's (None for
    an answer dropped as a duplicate: the review read a text the merged ledger does not hold)."""
    s, d = src._db, dst._db
    with d.conn:
        for table in ORDER:
            if table not in s.table_names():
                continue
            pk = ("dataset_hash", "id") if table == "cases" else "id"
            rows = list(s[table].rows)
            if table == "runs":
                new = [r for r in rows if not d["runs"].count_where("id = ?", [r["id"]])]
                counts["runs"] += len(new)
                for r in rows:  # the same run finished elsewhere: keep the most advanced status
                    if d["runs"].count_where("id = ?", [r["id"]]) and r["status"] == "complete":
                        d["runs"].update(r["id"], {"status": "complete", "finished_at": r["finished_at"]})
                rows = new
            if rows:
                d[table].upsert_all(rows, pk=pk, alter=True)
        ids: dict[int, int] = {}
        seq: dict[str, int] = {}
        for r in s.query("select * from requests order by id"):
            key = _key(r)
            if r["final"] and not r["is_warmup"]:
                if key in seen:
                    counts["duplicates_dropped"] += 1
                    continue
                seen.add(key)
            old = r.pop("id")
            if r["run_id"] not in seq:
                seq[r["run_id"]] = dst.max_seq(r["run_id"])
            seq[r["run_id"]] += 1
            r["seq"] = seq[r["run_id"]]
            ids[old] = int(d["requests"].insert(r, alter=True).last_pk)
            counts["requests"] += 1
        grades = []
        for g in s.query("select * from grades order by id"):
            if g["request_id"] in ids:
                g.pop("id")
                g["request_id"] = ids[g["request_id"]]
                grades.append(g)
        if grades:
            d["grades"].insert_all(grades, alter=True)
        counts["grades"] += len(grades)
        samples = [{k: v for k, v in x.items() if k != "id"} for x in s.query("select * from server_samples")]
        if samples:
            d["server_samples"].insert_all(samples, alter=True)
        counts["server_samples"] += len(samples)
        if "token_scores" in s.table_names():  # teacher-forced scores follow the answers they scored
            scores = [{**x, "answer_request_id": ids.get(x["answer_request_id"])} for x in s["token_scores"].rows]
            counts["token_scores"] = counts.get("token_scores", 0) + dst.copy_token_scores(scores)
    reviews = []
    for r in s.query("select * from reviews order by id"):
        r.pop("id")
        for k in ("baseline_request_id", "candidate_request_id"):
            r[k] = ids.get(r[k]) if r[k] is not None else None
        reviews.append(r)
    return reviews
