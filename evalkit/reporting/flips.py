"""Flips (Dutta et al. 2024, "Accuracy is not all you need"): the share of cases whose pass/fail
changed between the baseline and a candidate, in either direction, for every pass/fail grader
that offers a pass-rate margin (schema, persona) and every persona rule. Two variants with the
same pass rate can still disagree on many cases: the net change hides gains and losses that
cancel; the flip rate does not.

The flip rate is one proportion (k flips of n cases, each case's first repeat, like a pass-rate
margin): its interval and its margin test are the exact binomial test of `stats.binomial`. A
margin `<grader>_flips: 5pp` (or `flips_max: 5pp` for every such grader) tests one hypothesis,
"the flip rate is the margin", two-sided, in the variant's Holm family with the other margins.
At temperature > 0 sampling alone flips answers: the table sets beside each rate the baseline's
own flips between its two passes (its noise floor), and a flips margin is meant for greedy runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..grading.margins import flip_metrics as flip_metrics
from ..grading.margins import is_flips as is_flips
from ..ledger import Ledger
from ..stats.binomial import FlipRate, cases_to_show_below


def passes(rows: list[dict[str, Any]], variant: str, grader: str, rule: str | None, repeat: int = 0
            ) -> dict[str, bool]:
    """case -> pass/fail of one repeat (the lowest at or above ``repeat``) of a variant."""
    best: dict[str, tuple[int, bool]] = {}
    for r in rows:
        g = r.get("grades", {}).get(grader)
        if r["variant"] != variant or g is None or r["repeat"] < repeat:
            continue
        if rule is None:
            ok = g.get("passed")
        else:
            ok = ((g.get("detail") or {}).get("rules") or {}).get(rule, {}).get("passed")
        if ok is None:
            continue
        if r["case_id"] not in best or r["repeat"] < best[r["case_id"]][0]:
            best[r["case_id"]] = (r["repeat"], bool(ok))
    return {c: ok for c, (_, ok) in best.items()}


def count(base: dict[str, bool], cand: dict[str, bool]) -> tuple[int, int, int]:
    """(cases, gains, losses) on the cases both have: a gain is fail -> pass."""
    cases = sorted(set(base) & set(cand))
    gains = sum(1 for c in cases if cand[c] and not base[c])
    losses = sum(1 for c in cases if base[c] and not cand[c])
    return len(cases), gains, losses


def flips(ledger: Ledger, run_id: str, baseline: str | None, by: Sequence[str] = (), repeats: int | None = None
          ) -> list[dict[str, Any]]:
    """Per candidate and pass/fail grader (and persona rule), at each variant's first level: cases,
    gains, losses, the flip rate with its exact 95 % interval, the net pass-rate change, and the
    baseline's own flip rate between its passes (the floor; None without a floor pass), counted in
    the ledger (`Ledger.flip_counts`). ``by``: per value(s) of these slice keys too (``group``);
    ``repeats``: the run's, to leave the baseline's noise-floor passes out (then no floor)."""
    if not baseline:
        return []
    metrics = flip_metrics()
    got, floors = ledger.flip_counts(run_id, baseline, list(dict.fromkeys(metrics.values())), by, repeats)
    floor = {(f["group"], f["grader"], f["rule"]): f for f in floors}
    at: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for e in got:
        at[(e["group"], e["variant"], e["grader"])].append(e)
    out = []
    for group, variant in sorted({(e["group"], e["variant"]) for e in got}, key=lambda k: (_order(k[0]), k[1])):
        for metric, grader in metrics.items():
            for e in sorted(at.get((group, variant, grader), []), key=lambda e: (e["rule"] is not None, e["rule"] or "")):
                t = FlipRate(e["gains"] + e["losses"], e["cases"])
                ci = t.interval(0.05)
                f = floor.get((group, grader, e["rule"]))
                out.append({**({"group": group} if by else {}), "variant": variant, "metric": metric, "grader": grader,
                            "rule": e["rule"], "cases": e["cases"], "gains": e["gains"], "losses": e["losses"],
                            "flip_pct": t.estimate, "ci95": list(ci) if ci else None,
                            "net_pp": 100.0 * (e["gains"] - e["losses"]) / e["cases"],
                            "floor_flip_pct": 100.0 * f["flips"] / f["cases"] if f and f["cases"] else None})
    return out


def _order(group: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(x) for x in group)


def lines(table: list[dict[str, Any]], margins: list[Any] | None = None) -> list[str]:
    """A line per candidate and grader (rules stay in the table), and what a flips margin needs."""
    out = []
    for e in table:
        if e["rule"] is not None:
            continue
        ci = e["ci95"]
        floor = "" if e["floor_flip_pct"] is None else f"; the baseline flips {e['floor_flip_pct']:.0f} % against its " \
            "own other pass"
        out.append(f"flips {e['variant']} vs baseline, {e['grader']}: {e['gains'] + e['losses']} of {e['cases']} cases "
                   f"({e['flip_pct']:.0f} % [{ci[0]:.0f}, {ci[1]:.0f}]: {e['losses']} lost, {e['gains']} gained; net "
                   f"{e['net_pp']:+.0f} pp){floor}")
    own = [e["floor_flip_pct"] for e in table if e["rule"] is None and e["floor_flip_pct"]]
    if own and any(is_flips(m.metric) for m in margins or []):
        out.append(f"flips margins test the flip rate against the margin, not against sampling's own flips (the "
                   f"baseline flips up to {max(own):.0f} % against itself here): they are meant for greedy runs")
    for m in margins or []:
        if is_flips(m.metric):
            need = cases_to_show_below(m.value)
            most = max((e["cases"] for e in table if e["metric"] == m.metric and e["rule"] is None), default=0)
            if most < need:
                out.append(f"{m.metric} margin {m.describe()}: showing flips below it needs at least {need} cases with "
                           f"no flip at all ({most} here)")
    return out
