"""Task accuracy the way model publishers report it, but paired (issue 49): per variant and suite
the items answered right, wrong and unparsed; for each candidate against the baseline on the same
items, recovery (candidate accuracy / baseline's) with its paired cluster bootstrap interval, the
items lost and gained, and McNemar's exact p. Read from the ledger's grades of the `accuracy`
grader (its first load level, each case's first repeat), so every output says the same."""

from __future__ import annotations

from typing import Any

from ..ledger import Ledger
from ..stats.accuracy import mcnemar_exact, recovery


def suite_accuracy(ledger: Ledger, run_id: str, baseline: str | None, repeats: int) -> list[dict[str, Any]]:
    """One entry per variant and suite: n, right, wrong, unparsed, accuracy %; a candidate's also
    its pairs with the baseline, recovery % [interval], lost, gained and McNemar's p."""
    first: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (variant, suite) -> case -> first repeat's grade
    for g in ledger.grade_details(run_id, "accuracy"):
        suite = g["detail"].get("suite")
        if not suite or g["value"] is None or g["repeat"] >= repeats:  # a noise-floor pass is not a case
            continue
        cases = first.setdefault((g["variant"], suite), {})
        if g["case_id"] not in cases or g["repeat"] < cases[g["case_id"]]["repeat"]:
            cases[g["case_id"]] = g
    out = []
    for (variant, suite), cases in sorted(first.items(), key=lambda kv: (kv[0][1], kv[0][0] != baseline, kv[0][0])):
        right = sum(1 for g in cases.values() if g["value"])
        unparsed = sum(1 for g in cases.values() if g["detail"].get("unparsed"))
        e: dict[str, Any] = {"variant": variant, "suite": suite, "n": len(cases), "right": right,
                             "wrong": len(cases) - right, "unparsed": unparsed,
                             "accuracy_pct": 100.0 * right / len(cases) if cases else None}
        base = first.get((baseline, suite)) if baseline and variant != baseline else None
        if base:
            both = sorted(set(cases) & set(base))
            b = [bool(base[c]["value"]) for c in both]
            c = [bool(cases[k]["value"]) for k in both]
            r = recovery(b, c, [str(base[k]["detail"].get("cluster") or k) for k in both])
            lost = sum(1 for x, y in zip(b, c, strict=True) if x and not y)
            gained = sum(1 for x, y in zip(b, c, strict=True) if y and not x)
            e.update({"pairs": len(both), "recovery_pct": r.estimate, "recovery_ci": list(r.interval) if r.interval
                      else None, "recovery_method": r.method, "clusters": r.clusters, "lost": lost, "gained": gained,
                      "mcnemar_p": mcnemar_exact(lost, gained)})
        out.append(e)
    return out


def lines(entries: list[dict[str, Any]], baseline: str | None) -> list[str]:
    out = []
    for e in entries:
        acc = "-" if e["accuracy_pct"] is None else f"{e['accuracy_pct']:.1f} %"
        line = (f"accuracy {e['suite']}: {e['variant']} {e['right']} of {e['n']} right ({acc}), {e['wrong']} wrong, "
                f"{e['unparsed']} unparsed")
        if "pairs" in e:
            ci = e["recovery_ci"]
            rec = "-" if e["recovery_pct"] is None else f"{e['recovery_pct']:.1f} %" + (
                f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
            line += (f"; against {baseline} on {e['pairs']} items: recovery {rec} (paired cluster bootstrap over "
                     f"{e['clusters']} clusters, 95 %), lost {e['lost']}, gained {e['gained']}, McNemar exact "
                     f"p {e['mcnemar_p']:.3g}")
        out.append(line)
    return out
