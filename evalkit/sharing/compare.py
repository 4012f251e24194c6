"""The comparison view's data (issue 35): a run's baseline/candidate pairs of answers ordered by
interest (flips first, then the largest teacher-forced KL, then drift), filtered, counted; and
one pair in full: both answers with a word diff, the baseline's tokens with the candidate's KL at
each, the first divergence, every grader's verdict on both sides, latency and reviews. The HTML
is `compare_html.py`'s; the Datasette plugin only routes to these."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..ledger import Ledger
from ..reporting.reviews import flipped, passed_of
from ..reporting.rows import request_rows
from ..reporting.selection import first_level

FACETS = ("complexity", "persona", "formality", "task")  # case fields every workload's facets start with
_WORDS = re.compile(r"\s+|[^\s]+")


@dataclass
class Filters:
    """What the list page's form asks for; empty means everything."""

    candidate: str | None = None
    grader: str | None = None  # with result: the candidate's verdict from this grader
    result: str | None = None  # "pass" | "fail"
    flips_only: bool = False
    attrs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_query(cls, q: dict[str, str]) -> Filters:
        attrs = {k[2:]: v for k, v in q.items() if k.startswith("a.") and v}
        res = q.get("result") or None
        if res not in (None, "pass", "fail"):
            raise UsageError(f"result must be pass or fail, not {res!r}")
        return cls(q.get("candidate") or None, q.get("grader") or None, res, q.get("flips") in ("1", "on", "true"),
                   attrs)


def _first(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(variant, case) -> the answer a pair compares: first level, first repeat, first sent (as the
    divergence grader picks it; `Ledger.first_answers` reads just those)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(first_level(rows), key=lambda r: (r.get("repeat") or 0, r["id"])):
        out.setdefault((r["variant"], r["case_id"]), r)
    return out


def _kl(cand: dict[str, Any]) -> dict[str, Any]:
    d = (cand["grades"].get("divergence") or {}).get("detail") or {}
    return d if d.get("status") == "ok" and d.get("kind") == "candidate" else {}


def _drift(cand: dict[str, Any]) -> float | None:
    d = (cand["grades"].get("drift") or {}).get("detail") or {}
    return d.get("drift") if d.get("kind") != "noise_floor" else None


def _pair(base: dict[str, Any], cand: dict[str, Any], reviews: dict[tuple[str, str], list[dict[str, Any]]]
          ) -> dict[str, Any]:
    kl = _kl(cand)
    return {"case_id": cand["case_id"], "candidate": cand["variant"], "baseline_request_id": base["id"],
            "candidate_request_id": cand["id"], "flips": flipped(base, cand), "kl_mean": kl.get("kl_mean"),
            "first_diff_token": kl.get("first_diff_token", kl.get("first_top1_diff")), "identical": kl.get("identical"),
            "drift": _drift(cand), "attributes": {**{k: cand.get(k) for k in FACETS if cand.get(k) is not None},
                                                  **(cand.get("attributes") or {})},
            "grades": {n: passed_of(g) for n, g in cand["grades"].items()},
            "errors": [r["variant"] for r in (base, cand) if r.get("error_class")],
            "reviews": reviews.get((cand["case_id"], cand["variant"]), [])}


def interest(p: dict[str, Any]) -> tuple[int, float, float]:
    """Sort key, most interesting first: any flip, then the largest KL, then the largest drift."""
    return (-len(p["flips"]), -(p["kl_mean"] if p["kl_mean"] is not None else -1.0),
            -(p["drift"] if p["drift"] is not None else -1.0))


def _matches(p: dict[str, Any], f: Filters) -> bool:
    if f.candidate and p["candidate"] != f.candidate:
        return False
    if f.flips_only and not p["flips"]:
        return False
    if f.grader and f.result and p["grades"].get(f.grader) is not (f.result == "pass"):
        return False
    return all(str(p["attributes"].get(k)) == v for k, v in f.attrs.items())


def case_list(ledger: Ledger, run_id: str | None, filters: Filters | None = None) -> dict[str, Any]:
    """A run's pairs (each candidate against the baseline, one answer per case), filtered and
    ordered by `interest`, with counts over all pairs and over the shown ones."""
    run = ledger.require_run(run_id)
    run_id = run["id"]
    baseline = ledger.baseline(run_id)
    if baseline is None:
        raise UsageError(f"run {run_id} has no baseline variant: nothing to compare against")
    f = filters or Filters()
    firsts = _first(request_rows(ledger, run_id, ids=ledger.first_answers(run_id)))
    reviews: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ledger.reviews(run_id):
        reviews.setdefault((r["case_id"], r["candidate"]), []).append(r)
    # the baseline's answers the candidates were teacher-forced on, where one is not its first
    forced = {i for (v, _), r in firsts.items() if v != baseline
              and type(i := _kl(r).get("answer_request_id")) is int}
    base_ids = {r["id"]: r for r in firsts.values() if r["variant"] == baseline}
    if extra := sorted(forced - set(base_ids)):
        base_ids.update({r["id"]: r for r in request_rows(ledger, run_id, baseline, ids=extra)})
    # the baseline answer a candidate was teacher-forced on, where it was: its tokens are the heat's
    pairs = [_pair(base_ids.get(_kl(r).get("answer_request_id"), firsts[(baseline, case)]), r, reviews)
             for (v, case), r in firsts.items() if v != baseline and (baseline, case) in firsts]
    shown = sorted((p for p in pairs if _matches(p, f)), key=interest)
    facets: dict[str, Counter[str]] = {}
    for p in pairs:
        for k, v in p["attributes"].items():
            if isinstance(v, str | int | float | bool) and len(str(v)) <= 60:  # no facet of descriptions
                facets.setdefault(k, Counter())[str(v)] += 1
    return {"run_id": run_id, "baseline": baseline, "candidates": sorted({p["candidate"] for p in pairs}),
            "graders": sorted({g for p in pairs for g, ok in p["grades"].items() if ok is not None}),
            "facets": {k: dict(sorted(c.items())) for k, c in sorted(facets.items()) if 1 < len(c) <= 40},
            "pairs": shown, "filters": f,
            "counts": {"pairs": len(pairs), "shown": len(shown), "flips": sum(bool(p["flips"]) for p in pairs),
                       "scored": sum(p["kl_mean"] is not None for p in pairs),
                       "reviewed": sum(bool(p["reviews"]) for p in pairs),
                       "shown_flips": sum(bool(p["flips"]) for p in shown)}}


def word_diff(a: str, b: str) -> list[tuple[str, str, str]]:
    """(op, baseline words, candidate words) runs, op one of equal/replace/delete/insert; words
    keep their whitespace so the runs join back into each text."""
    wa, wb = _WORDS.findall(a or ""), _WORDS.findall(b or "")
    return [(op, "".join(wa[i1:i2]), "".join(wb[j1:j2]))
            for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes()]


def heat(ref: dict[str, Any] | None, detail: dict[str, Any]) -> list[dict[str, Any]]:
    """The baseline answer's tokens (as the baseline's server cut them), each with the candidate's
    KL at that token, its shade 0-1 (against the largest KL of this answer) and whether the two
    answers first diverge there."""
    toks = ((ref or {}).get("tokens") or {}).get("text") or []
    kls = detail.get("kl_tokens") or []
    if not toks or len(kls) != len(toks):
        return []
    top = max(kls) or 1.0
    first = detail.get("first_diff_token")
    first = detail.get("first_top1_diff") if first is None else first
    return [{"text": t or "", "kl": k, "shade": round(min(1.0, k / top), 3), "first": i == first}
            for i, (t, k) in enumerate(zip(toks, kls, strict=True))]


def case_view(ledger: Ledger, run_id: str, case_id: str, candidate: str) -> dict[str, Any]:
    """One pair in full (see the module's docstring)."""
    listing = case_list(ledger, run_id, Filters(candidate=candidate))
    p = next((x for x in listing["pairs"] if x["case_id"] == case_id), None)
    if p is None:
        raise UsageError(f"run {run_id} has no pair for case {case_id!r} and candidate {candidate!r}")
    base, cand = ledger.request(p["baseline_request_id"]), ledger.request(p["candidate_request_id"])
    grades = ledger.latest_grades(run_id)
    gb, gc = grades.get(base["id"], {}), grades.get(cand["id"], {})
    kl = _kl({"grades": gc})
    refs = ledger.token_score_rows(list(kl.get("token_rows") or []))
    ref = refs.get((kl.get("token_rows") or [None])[0])
    return {**p, "baseline": listing["baseline"], "base": base, "cand": cand,
            "diff": word_diff(base.get("text") or "", cand.get("text") or ""),
            "heat": heat(ref, kl), "kl": kl, "token_rows": list(kl.get("token_rows") or []),
            "verdicts": [{"grader": n, "baseline": gb.get(n), "candidate": gc.get(n)} for n in sorted(set(gb) | set(gc))],
            "all_reviews": [r for r in ledger.reviews(run_id, latest=False)
                            if r["case_id"] == case_id and r["candidate"] == candidate]}


def submit_review(ledger: Ledger, form: dict[str, Any], reviewer: str) -> int:
    """A review posted by the case page's form: the two request ids must be the run's answers of
    that case by the baseline and the candidate (a stale or forged form writes nothing)."""
    run = ledger.require_run(form.get("run") or None)
    baseline = ledger.baseline(run["id"])
    try:
        ids = int(form.get("baseline_request_id") or ""), int(form.get("candidate_request_id") or "")
    except ValueError:
        raise UsageError("a review names the two answers' request ids") from None
    keys = ledger.answer_keys(list(ids))
    for rid, variant in zip(ids, (baseline, form.get("candidate")), strict=True):
        if keys.get(rid) != (run["id"], variant, form.get("case")):
            raise UsageError(f"request {rid} is not {variant}'s answer to case {form.get('case')!r} in run {run['id']}")
    return ledger.record_review({
        "run_id": run["id"], "case_id": form.get("case"), "baseline": baseline, "candidate": form.get("candidate"),
        "baseline_request_id": ids[0], "candidate_request_id": ids[1], "reviewer": reviewer,
        "verdict": form.get("verdict"), "comment": form.get("comment")})
