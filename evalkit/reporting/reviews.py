"""What people said about a run's pairs (`evalkit browse --review`, the `reviews` table) in the
report: how many pairs were reviewed, the split of verdicts, and the verdicts set against the
graders' flips on the same pairs (a pair whose candidate lost a pass that people call "same" is a
grader to look at). Also the one definition of a pair's flips the comparison view shows."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..grading.calibrate_labels import against_reviews
from ..ledger import Ledger

LABELS = {"same": "same", "candidate_better": "candidate better", "candidate_worse": "candidate worse",
          "both_fail": "both fail"}


def passed_of(g: dict[str, Any] | None) -> bool | None:
    return None if g is None or g.get("passed") is None else bool(g["passed"])


def flipped(base: dict[str, Any], cand: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pass/fail grader (and persona rule) whose verdict differs between two answers."""
    out = []
    for name in sorted(set(base["grades"]) & set(cand["grades"])):
        gb, gc = base["grades"][name], cand["grades"][name]
        b, c = passed_of(gb), passed_of(gc)
        if b is not None and c is not None and b != c:
            out.append({"grader": name, "rule": None, "baseline": b, "candidate": c})
        rb, rc = (gb.get("detail") or {}).get("rules") or {}, (gc.get("detail") or {}).get("rules") or {}
        for rule in sorted(set(rb) & set(rc)):
            b, c = rb[rule].get("passed"), rc[rule].get("passed")
            if b is not None and c is not None and bool(b) != bool(c):
                out.append({"grader": name, "rule": rule, "baseline": bool(b), "candidate": bool(c)})
    return out


def review_summary(ledger: Ledger, run_id: str, baseline: str | None) -> dict[str, Any] | None:
    """None without reviews; else pairs reviewed of all (`Ledger.reviewable_pairs`), reviewers,
    the verdicts' split (each reviewer's newest per pair), and the split again for reviewed pairs
    whose candidate lost a pass, gained one, or flipped nothing: the reviewed answers' rows alone
    are read."""
    from .rows import request_rows  # here: the report's import of this module stays light

    revs = ledger.reviews(run_id)
    if not revs or baseline is None:
        return None
    ids = sorted({i for r in revs for i in (r["baseline_request_id"], r["candidate_request_id"])})
    rows = request_rows(ledger, run_id, ids=ids)
    by_id = {r["id"]: r for r in rows}
    pairs = ledger.reviewable_pairs(run_id, baseline)
    against: dict[str, Counter[str]] = {"lost": Counter(), "gained": Counter(), "no flip": Counter()}
    for r in revs:
        base, cand = by_id.get(r["baseline_request_id"]), by_id.get(r["candidate_request_id"])
        fl = flipped(base, cand) if base is not None and cand is not None else []
        lost, gained = any(f["baseline"] for f in fl), any(f["candidate"] for f in fl)
        for key, on in (("lost", lost), ("gained", gained), ("no flip", not fl)):
            if on:
                against[key][r["verdict"]] += 1
    grades = {r["id"]: r["grades"] for r in rows}
    names = sorted({n for r in revs for i in (r["baseline_request_id"], r["candidate_request_id"])
                    for n, g in (grades.get(i) or {}).items() if g.get("passed") is not None})
    agreement = {n: {k: a[k] for k in ("kappa", "ci95", "n")} for n in names
                 if (a := against_reviews(n, revs, grades))["n"]}
    return {"pairs": pairs, "reviewed_pairs": len({(r["case_id"], r["candidate"]) for r in revs}),
            "reviews": len(revs), "reviewers": sorted({r["reviewer"] for r in revs}),
            "split": dict(Counter(r["verdict"] for r in revs)), "against_flips": {k: dict(v) for k, v in against.items()},
            "agreement": agreement}


def _split(c: dict[str, int]) -> str:
    return ", ".join(f"{LABELS[k]} {c[k]}" for k in LABELS if c.get(k)) or "none"


def review_lines(s: dict[str, Any] | None) -> list[str]:
    """The report's lines about reviews (none without reviews)."""
    if not s:
        return []
    out = [f"reviews: {s['reviewed_pairs']} of {s['pairs']} pairs reviewed by {len(s['reviewers'])} reviewer(s) "
           f"({', '.join(s['reviewers'])}): {_split(s['split'])}"]
    a = s["against_flips"]
    for key, what in (("lost", "whose candidate lost a grader's pass"), ("gained", "whose candidate gained a pass"),
                      ("no flip", "with no flip")):
        if a.get(key):
            out.append(f"reviews of pairs {what}: {_split(a[key])}")
    for name, k in s.get("agreement", {}).items():
        ci = f" [{k['ci95'][0]:+.2f}, {k['ci95'][1]:+.2f}]" if k["ci95"] else ""
        kappa = "undefined" if k["kappa"] is None else f"{k['kappa']:+.2f}{ci}"
        out.append(f"reviews vs {name}: Cohen's kappa {kappa} over {k['n']} reviewed pairs "
                   f"(`evalkit graders calibrate --grader {name} --reviews` for the confusion matrix)")
    return out
