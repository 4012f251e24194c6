"""Any pass/fail grader (the LLM judge included) against people's labels (issue 35): Cohen's kappa
with a bootstrap interval and the confusion matrix, overall and per rule or criterion.

Two sources of labels:
- **a labelled file** (JSON lines ``{"case_id", "text", "passed", "labels": {rule: bool}}``, cases
  from the shipped dataset): the grader grades each text afresh; its pass/fail (and each rule's,
  or each judge criterion's: grade ≥ 3) against the label. `rubrics/judge_labels.jsonl` is the
  judge's, derived from the persona labels by `rubrics/judge_labels.py`.
- **a ledger's reviews** (`evalkit browse --review`): a reviewed pair's verdict (same / candidate
  better / candidate worse / both fail) against the same category read off the grader's two
  verdicts on that pair: pass/pass = same, fail/pass = better, pass/fail = worse, fail/fail =
  both fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..paths import rubrics_dir
from ..stats.agreement import cohen_kappa, confusion_lines, strength
from .base import GradedRequest, GraderContext

PAIR = ("same", "candidate_better", "candidate_worse", "both_fail")
PASS_FAIL = ("pass", "fail")
LABEL_FILES = {"judge": "judge_labels.jsonl"}  # graders whose labelled file is not their calibration_file


def pair_category(base_passed: bool, cand_passed: bool) -> str:
    """A pair's review category read off one grader's two verdicts."""
    return {(True, True): "same", (False, True): "candidate_better", (True, False): "candidate_worse",
            (False, False): "both_fail"}[(base_passed, cand_passed)]


def passed_on(grade: dict[str, Any] | None, rule: str | None) -> bool | None:
    """A grade's pass/fail, or one rule's (persona `rules`) or criterion's (judge `criteria`,
    grade ≥ 3); None when it says nothing."""
    if grade is None:
        return None
    if rule is None:
        return None if grade.get("passed") is None else bool(grade["passed"])
    d = grade.get("detail") or {}
    if rule in (d.get("rules") or {}):
        p = d["rules"][rule].get("passed")
        return None if p is None else bool(p)
    g = ((d.get("criteria") or {}).get(rule) or {}).get("grade")
    return None if g is None else g >= 3


def _rules(grades: list[dict[str, Any] | None]) -> list[str]:
    names: set[str] = set()
    for g in grades:
        d = (g or {}).get("detail") or {}
        names.update((d.get("rules") or {}).keys(), (d.get("criteria") or {}).keys())
    return sorted(names)


def against_reviews(grader: str, reviews: list[dict[str, Any]], grades: dict[int, dict[str, dict[str, Any]]]
                    ) -> dict[str, Any]:
    """Kappa of the grader's pair categories (rows) against the reviewers' (columns), overall and
    per rule; reviews of pairs the grader did not grade on both sides are left out (counted)."""
    pairs = [(grades.get(r["baseline_request_id"], {}).get(grader), grades.get(r["candidate_request_id"], {}).get(grader),
              r["verdict"]) for r in reviews]
    out: dict[str, Any] = {"grader": grader, "source": "reviews", "reviews": len(reviews), "rules": {}}
    for rule in [None, *_rules([g for b, c, _ in pairs for g in (b, c)])]:
        mine, theirs = [], []
        for b, c, verdict in pairs:
            pb, pc = passed_on(b, rule), passed_on(c, rule)
            if pb is not None and pc is not None:
                mine.append(pair_category(pb, pc))
                theirs.append(verdict)
        if rule is None:
            out.update(cohen_kappa(mine, theirs, PAIR), unmatched=len(reviews) - len(mine))
        elif mine:
            out["rules"][rule] = cohen_kappa(mine, theirs, PAIR)
    return out


def label_file(grader: str, path: Path | None, rubrics: Path | None = None) -> Path:
    if path is not None:
        return path
    if grader in LABEL_FILES:
        return (rubrics or rubrics_dir()) / LABEL_FILES[grader]
    raise UsageError(f"--file: grader '{grader}' has no labelled file of its own; give --file (JSON lines with "
                     "case_id, text, passed) or --ledger to use a ledger's reviews")


def read_labels(p: Path) -> list[dict[str, Any]]:
    """The labelled rows; a bad line is a usage error naming file:line."""
    from ..spec.config import jsonl_objects

    rows = []
    for i, row in jsonl_objects(p, "labelled file"):
        try:
            if not isinstance(row["case_id"], str) or not isinstance(row["text"], str) or \
                    not isinstance(row["passed"], bool):
                raise TypeError
        except (KeyError, TypeError):
            raise UsageError(f"{p}:{i}: expected case_id, text and passed (true/false), labels optional") from None
        rows.append({**row, "line": i})
    return rows


def against_file(grader: str, path: Path | None, ctx: GraderContext | None = None) -> dict[str, Any]:
    """The grader grades each labelled text afresh; kappa of its pass/fail (rows) against the
    label (columns), overall and per labelled rule or criterion."""
    from ..spec.dataset import load_cases
    from .registry import available, make_graders

    cls = available().get(grader)
    if cls is None or cls.kind != "request":
        raise UsageError(f"--grader: '{grader}' does not grade one answer on its own (a labelled file needs one)")
    p = label_file(grader, path)
    rows = read_labels(p)
    cases = {c.id: c for c in load_cases()}
    missing = [r for r in rows if r["case_id"] not in cases]
    if missing:
        raise UsageError(f"{p}:{missing[0]['line']}: case '{missing[0]['case_id']}' is not in the shipped dataset")
    g = make_graders([grader], ctx or GraderContext())[0]
    items = [GradedRequest(k, "labelled", r["text"], "stop", cases[r["case_id"]]) for k, r in enumerate(rows)]
    scores = g.grade_outputs(items, {i.request_id: 0 for i in items}, None)
    got = [{"passed": s.passed, "detail": s.detail} if (s := scores.get(k)) else None for k in range(len(rows))]
    out: dict[str, Any] = {"grader": grader, "source": str(p), "rows": len(rows), "rules": {}}
    for rule in [None, *sorted({k for r in rows for k in (r.get("labels") or {})})]:
        mine, theirs = [], []
        for r, s in zip(rows, got, strict=True):
            want = r["passed"] if rule is None else (r.get("labels") or {}).get(rule)
            have = passed_on(s, rule)
            if want is not None and have is not None:
                mine.append("pass" if have else "fail")
                theirs.append("pass" if want else "fail")
        if rule is None:
            out.update(cohen_kappa(mine, theirs, PASS_FAIL), unmatched=len(rows) - len(mine))
        elif mine:
            out["rules"][rule] = cohen_kappa(mine, theirs, PASS_FAIL)
    return out


def _kappa_text(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "no item has both a grader verdict and a label (the grader passed or failed none of them)"
    if r["kappa"] is None:
        return f"kappa undefined (n {r['n']}: one rater used a single label throughout)"
    ci = r["ci95"]
    ci_txt = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
    return f"kappa {r['kappa']:+.2f}{ci_txt} ({strength(r['kappa'])}), agreement {100 * r['observed']:.0f} % " \
           f"(chance {100 * r['expected']:.0f} %), n {r['n']}"


def agreement_lines(r: dict[str, Any]) -> list[str]:
    """A calibration against labels as text: the overall kappa, the confusion matrix, per rule."""
    what = "reviewed pairs" if r["source"] == "reviews" else f"labelled texts in {r['source']}"
    out = [f"{r['grader']} vs people ({what}): {_kappa_text(r)}"]
    if r.get("unmatched"):
        out.append(f"  left out {r['unmatched']} the grader gave no pass/fail for")
    if r["n"]:
        out += ["  " + x for x in confusion_lines(r, f"{r['grader']}", "people")]
    out += [f"  {rule}: {_kappa_text(x)}" for rule, x in r["rules"].items()]
    out.append("  kappa: agreement beyond chance (1 = perfect, 0 = chance); 95 % percentile bootstrap over items")
    return out


def calibrate(grader: str, path: Path | None = None, ledger: Any = None, run_id: str | None = None,
              judge: Any = None) -> dict[str, Any]:
    """`graders calibrate` beyond a grader's own calibration: against a run's reviews when a
    ledger is given, else against a labelled file (the judge's shipped one by default)."""
    from .registry import HOW_TO_REGISTER, available

    if grader not in available():
        raise UsageError(f"--grader: no grader '{grader}' (known: {', '.join(available())}); give --grader-path DIR, "
                         f"run it in its workload folder, or use --reviews on a run that recorded it; {HOW_TO_REGISTER}")
    if ledger is not None:
        run = ledger.require_run(run_id)
        reviews = ledger.reviews(run["id"])
        if not reviews:
            raise UsageError(f"run {run['id']} has no reviews yet: `evalkit browse --review --reviewer NAME` makes them")
        return against_reviews(grader, reviews, ledger.latest_grades(run["id"]))
    if grader == "judge" and judge is None:
        raise UsageError("the judge needs a served model to ask: --judge-endpoint URL --judge-model NAME")
    return against_file(grader, path, GraderContext(judge=judge))
