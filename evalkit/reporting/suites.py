"""Task accuracy the way model publishers report it, but paired (issue 49): per variant and suite
the items answered right, wrong and unparsed; for each candidate against the baseline on the same
items, recovery (candidate accuracy / baseline's) with its paired cluster bootstrap interval, the
items lost and gained, and McNemar's exact p. Read from the ledger's grades of the `accuracy`
grader (its first load level, each case's first repeat), so every output says the same."""

from __future__ import annotations

from typing import Any

from ..ledger import Ledger
from ..stats.accuracy import mcnemar_exact, recovery


def paired(base: dict[str, bool], cand: dict[str, bool], clusters: dict[str, str]) -> dict[str, Any]:
    """A candidate against the baseline on the items both answered: recovery with its paired
    cluster bootstrap interval, the items lost and gained, McNemar's exact p."""
    both = sorted(set(cand) & set(base))
    b, c = [base[k] for k in both], [cand[k] for k in both]
    r = recovery(b, c, [clusters[k] for k in both])
    lost = sum(1 for x, y in zip(b, c, strict=True) if x and not y)
    gained = sum(1 for x, y in zip(b, c, strict=True) if y and not x)
    return {"pairs": len(both), "recovery_pct": r.estimate, "recovery_ci": list(r.interval) if r.interval else None,
            "recovery_method": r.method, "clusters": r.clusters, "lost": lost, "gained": gained,
            "mcnemar_p": mcnemar_exact(lost, gained)}


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
            e.update(paired({k: bool(g["value"]) for k, g in base.items()}, {k: bool(g["value"]) for k, g in cases.items()},
                            {k: str(g["detail"].get("cluster") or k) for k, g in base.items()}))
        out.append(e)
    return out


def choice_likelihood(ledger: Ledger, run_id: str, baseline: str | None) -> list[dict[str, Any]]:
    """Choice items scored by log-likelihood (`execution/choice_scoring.py`): per variant and suite,
    acc (highest summed log-probability) and acc_norm (per character, lm-eval's), each paired with
    the baseline like the generative accuracy."""
    import json

    from ..suites.choice import OptionScore, choose

    scores: dict[tuple[str, str], dict[int, tuple[float, int]]] = {}
    for r in ledger.choice_scores(run_id):
        scores.setdefault((r["variant"], r["case_id"]), {})[r["option"]] = (r["logprob"], r["tokens"])
    if not scores:
        return []
    attrs = {cid: json.loads(f.get("attributes_json") or "{}") for cid, f in ledger.case_fields(run_id, lean=True).items()}
    right: dict[tuple[str, str, str], dict[str, bool]] = {}  # (variant, suite, rule) -> case -> correct
    for (variant, cid), opts in scores.items():
        a = attrs.get(cid) or {}
        if set(opts) != set(range(len(a.get("options") or []))):
            continue  # an option was not scored: no pick
        pick = choose([OptionScore.of(" " + a["options"][k], *opts[k]) for k in sorted(opts)]).correct(a["gold"])
        for rule in ("acc", "acc_norm"):
            right.setdefault((variant, a["suite"], rule), {})[cid] = pick[rule]
    out = []
    for (variant, suite, rule), cases in sorted(right.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != baseline)):
        e: dict[str, Any] = {"variant": variant, "suite": f"{suite} ({rule}, log-likelihood)", "n": len(cases),
                             "right": sum(cases.values()), "wrong": len(cases) - sum(cases.values()), "unparsed": 0,
                             "accuracy_pct": 100.0 * sum(cases.values()) / len(cases)}
        base = right.get((baseline or "", suite, rule)) if variant != baseline else None
        if base:
            e.update(paired(base, cases, {k: str((attrs.get(k) or {}).get("cluster") or k) for k in base}))
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
            how = (f"paired cluster bootstrap over {e['clusters']} clusters, 95 %" if ci else
                   str(e.get("recovery_method") or "no interval"))
            line += (f"; against {baseline} on {e['pairs']} items: recovery {rec} ({how}), lost {e['lost']}, gained "
                     f"{e['gained']}, McNemar exact p {e['mcnemar_p']:.3g}")
        out.append(line)
    return out
