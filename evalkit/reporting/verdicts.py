"""Verdicts a team can act on: each candidate against the baseline, metric by metric, with a
margin the team chose: *superior*, *non-inferior*, *inferior* or *inconclusive*.

A margin is how much worse (in the metric's own unit: candidate minus baseline, paired by case,
or by block where the variants alternated in blocks of cases: `pairing`) the team accepts
(parsed by `grading.margins`). Each margin brings two hypotheses, "the true difference is the
margin" and "it is 0" (one when the margin is 0, or the margin alone when it is one-sided: a flip
rate, a batching floor), each tested two-sided; every hypothesis of one variant is in one Holm
family, so the chance that any verdict of the variant is wrong stays at or below 5 %. Each
metric's interval is printed at the level Holm's last step used (`stats.holm_level`), and the
verdict is read from that interval, so the two never disagree:

- non-inferior: the whole interval is better than the margin; superior: better than 0 too;
- inferior: the whole interval is worse than the margin; inconclusive: it reaches across it.

The test depends on the metric's kind: a ratio of means for % margins and a mean difference for
ms and absolute ones (a sign-flip test, a studentized bootstrap and a skewness-corrected one,
all of which must reject: `stats.robust`, valid on skewed and unequal-spread data), an exact unconditional score test for
pass rates (pp). Repeats of a case are averaged (a pass rate takes the case's first repeat) before
any test; a failed request takes the worst value observed (`pairing`); a graded sample is weighted
to its population. A sweep's levels can share one family (``levels``). Definitions and the
simulations that prove the error rate: docs/verdicts.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..grading.base import declared_case_values, hook
from ..grading.margins import ALPHA, LATENCY, UNIT, MarginSpec, qualified, tested_values
from ..grading.margins import hypotheses as hypotheses
from ..grading.margins import known_metrics as known_metrics
from ..grading.margins import pairs_needed as pairs_needed
from ..grading.margins import parse_margins as parse_margins
from ..grading.registry import available
from ..grading.registry import margins as grader_margins
from ..ledger import Ledger
from ..ledger.verdict_reads import PairInputs
from ..stats import PairedProportions, PairedTest, holm, holm_level, robust_mean, robust_ratio
from ..stats.binomial import FlipRate
from . import flips
from .pairing import blocked, by_blocks, grade_strata, imputed_means, latency_pairs, weighted, weights_text
from .rowseq import where
from .selection import level_of


def case_means(rows: list[dict[str, Any]], variant: str, field: str, repeats: set[int] | None = None
               ) -> dict[str, float]:
    """case -> the mean of one field over a variant's successful rows of that case (its repeats
    averaged: repeats of one case are not independent pairs)."""
    acc: dict[str, list[Any]] = {}  # case -> [sum, count], added in the rows' order: no list of values a case
    for r in rows:
        if r["variant"] == variant and r["error_class"] is None and r[field] is not None \
                and (repeats is None or r["repeat"] in repeats):
            a = acc.get(r["case_id"])
            if a is None:
                a = acc[r["case_id"]] = [0, 0]
            a[0] += r[field]
            a[1] += 1
    return {c: s / n for c, (s, n) in acc.items()}


def shared_repeats(rows: list[dict[str, Any]], baseline: str, variant: str) -> set[int]:
    """The repeats both variants sent (the baseline's extra noise-floor passes are not cases)."""
    def reps(v: str) -> set[int]:
        return {r["repeat"] for r in rows if r["variant"] == v}

    return reps(baseline) & reps(variant)


def grader_values(rows: list[dict[str, Any]], variant: str, grader: str) -> list[dict[str, Any]]:
    """A variant's newest grades of one grader, each with its case and repeat."""
    return [{**r["grades"][grader], "case_id": r["case_id"], "repeat": r["repeat"]} for r in rows
            if r["variant"] == variant and grader in r.get("grades", {})]


def paired_test(rows: list[dict[str, Any]], baseline: str, variant: str, ms: MarginSpec) -> PairedTest:
    """The test that decides one margin, on the cases both variants have. The test carries
    ``failures`` (failed requests per side, imputed: `pairing`) and ``weights`` (how a graded
    sample was weighted, or None). `input_test` is the same test from the ledger's reduction."""
    if flips.is_flips(ms.metric):
        grader = flips.flip_metrics()[ms.metric]
        return _flip_test(ms, flips.passes(rows, baseline, grader, None), flips.passes(rows, variant, grader, None))
    if ms.metric in LATENCY:
        field, hib = LATENCY[ms.metric]
        a, b, fails = latency_pairs(rows, baseline, variant, field, hib, shared_repeats(rows, baseline, variant),
                                    blocks="sum" if ms.unit == "%" else "mean")
        return _latency_test(ms, a, b, fails, blocked(rows))
    grader, _ = grader_margins()[qualified(ms.metric) or ms.metric]
    cls = available()[grader]
    a = hook(cls, "margin_values", grader_values(rows, variant, grader), False).get(ms.metric, {})
    b = hook(cls, "margin_values", grader_values(rows, baseline, grader), True).get(ms.metric, {})
    cases = sorted(set(a) & set(b))
    return _grader_test(ms, a, b, cases, grade_strata(rows, baseline, variant, cases))


def input_test(inp: PairInputs, grades: dict[tuple[str, str], list[dict[str, Any]]], baseline: str, variant: str,
               ms: MarginSpec) -> PairedTest:
    """`paired_test` from what the ledger reduced the two sides to (`Ledger.pair_inputs`): the
    per-case sums, values and passes, and the grades of a grader whose values are not declared."""
    if flips.is_flips(ms.metric):
        grader = flips.flip_metrics()[ms.metric]
        return _flip_test(ms, inp.passes.get((baseline, grader), {}), inp.passes.get((variant, grader), {}))
    if ms.metric in LATENCY:
        lc = inp.latency[LATENCY[ms.metric][0]]
        if lc.worst is None or not lc.cases:
            return _latency_test(ms, [], [], {"candidate": 0, "baseline": 0}, inp.blocked)
        a, b = imputed_means(lc.cand, lc.worst), imputed_means(lc.base, lc.worst)
        if inp.blocked:
            a, b = by_blocks(a, b, lc.units, "sum" if ms.unit == "%" else "mean")
        fails = {"candidate": sum(f for *_, f in lc.cand), "baseline": sum(f for *_, f in lc.base)}
        return _latency_test(ms, a, b, fails, inp.blocked)
    grader, _ = grader_margins()[qualified(ms.metric) or ms.metric]
    if (variant, grader) in grades:
        cls = available()[grader]
        a = hook(cls, "margin_values", grades[(variant, grader)], False).get(ms.metric, {})
        b = hook(cls, "margin_values", grades[(baseline, grader)], True).get(ms.metric, {})
    else:
        a, b = inp.values.get((variant, ms.metric), {}), inp.values.get((baseline, ms.metric), {})
    cases = sorted(set(a) & set(b))
    return _grader_test(ms, a, b, cases, weighted(inp.slice_of, inp.population, cases))


def _stamp(t: PairedTest, fails: dict[str, int] | None = None, strata: Any = None, by_block: bool = False
           ) -> PairedTest:
    t.failures = fails or {"candidate": 0, "baseline": 0}  # type: ignore[attr-defined]
    t.weights = weights_text(strata)  # type: ignore[attr-defined]
    t.paired_by = "block" if by_block else "case"  # type: ignore[attr-defined]
    return t


def _flip_test(ms: MarginSpec, base: dict[str, bool], cand: dict[str, bool]) -> PairedTest:
    n, g, lo = flips.count(base, cand)
    return _stamp(FlipRate(g + lo, n, ms.value))


def _latency_test(ms: MarginSpec, a: list[float], b: list[float], fails: dict[str, int], by_block: bool
                  ) -> PairedTest:
    t = robust_ratio(a, b) if ms.unit == "%" else robust_mean([x - y for x, y in zip(a, b, strict=True)])
    return _stamp(t, fails, by_block=by_block)


def _grader_test(ms: MarginSpec, a: dict[str, float], b: dict[str, float], cases: list[str], strata: Any
                 ) -> PairedTest:
    if ms.unit == "pp" and strata is None:
        return _stamp(PairedProportions.from_pairs([bool(a[c]) for c in cases], [bool(b[c]) for c in cases]))
    # a weighted sample of pass rates is a stratified mean of per-case differences (pp)
    scale = 100.0 if ms.unit == "pp" else 1.0
    return _stamp(robust_mean([scale * (float(a[c]) - float(b[c])) for c in cases],
                              **({} if strata is None else {"strata": strata[0], "weights": strata[1]})), strata=strata)


def graders_read(specs: list[MarginSpec]) -> set[str]:
    """The graders whose grades the margins' tests read (a grader's margin, a flips margin)."""
    fl, gm = flips.flip_metrics(), grader_margins()
    return {fl[m] if m in fl else gm[qualified(m) or m][0] for m in (ms.metric for ms in specs) if m not in LATENCY}


def decides(t: PairedTest, ms: MarginSpec) -> bool:
    """Whether a test's pairs are enough to read a verdict from: 2, or the margin's own floor."""
    return t.n >= max(2, ms.min_pairs)


def _decide(iv: tuple[float, float], ms: MarginSpec) -> tuple[str, str]:
    """The verdict an interval gives against a margin, and a note on where it lies against 0."""
    s = 1.0 if ms.higher_is_better else -1.0  # goodness = s x difference
    lo, hi = sorted((s * iv[0], s * iv[1]))
    m = s * ms.value
    if lo > m:
        if lo > 0 and ms.one_sided:  # below a floor an identical variant reads: no difference, not better
            return "non-inferior", "within the margin; below the baseline's own floor reads as no difference"
        if lo > 0:
            return "superior", "better than the baseline and than the margin"
        if hi < -m and m < 0:  # within the margin on both sides: no difference the margin cares about
            return "non-inferior", "equivalent: the whole interval lies within the margin on both sides"
        return "non-inferior", ("worse than the baseline, within the margin" if hi < 0 else
                                "better than the margin; not shown better than the baseline")
    if hi < m:
        return "inferior", "worse than the margin"
    return "inconclusive", "the interval reaches across the margin"


# one test of a variant's family: (the sweep level it is at, or None; its concurrency; margin; test)
Cell = tuple[int | None, int | None, MarginSpec, PairedTest]


def cells(rows: list[dict[str, Any]], baseline: str, variant: str, specs: list[MarginSpec],
          level: int | None = None) -> list[Cell]:
    """The test of each margin of one variant, on rows holding its and the baseline's (``level``:
    a sweep's level, every row at it; else each one's first level). The rows can go once these
    are made: a test keeps its per-case values, nothing of the rows."""
    conc = level if level is not None else min((level_of(r) for r in rows if r["variant"] == variant), default=None)
    return [(level, conc, ms, paired_test(rows, baseline, variant, ms)) for ms in specs]


def verdicts(rows: list[dict[str, Any]], baseline: str | None, specs: list[MarginSpec], alpha: float = ALPHA,
             levels: list[tuple[int, list[dict[str, Any]]]] | None = None, time: dict[str, Any] | None = None
             ) -> list[dict[str, Any]]:
    """One entry per candidate variant and margin (`family`). ``levels`` ((level, rows) of a sweep)
    puts every level's margins of a variant in its one family, so a sweep of many levels is not
    many chances to be wrong; ``rows`` is then unused. `ledger_verdicts` reads a run's rows a
    variant and level at a time instead."""
    if not baseline or not specs:
        return []
    groups = [(lv, rs, {r["variant"] for r in rs}) for lv, rs in (levels if levels is not None else [(None, rows)])]
    names = sorted(set().union(*(vs for _, _, vs in groups)) - {baseline})

    def pair(rs: list[dict[str, Any]], vs: set[str], v: str) -> list[dict[str, Any]]:
        """The candidate beside the baseline alone: a third variant's rows never enter its pairs."""
        return rs if vs <= {baseline, v} else where(rs, (r["variant"] in (baseline, v) for r in rs))

    return [e for v in names for e in family(v, [c for lv, rs, vs in groups if v in vs
                                                 for c in cells(pair(rs, vs, v), baseline, v, specs, lv)],
                                             specs, alpha, time)]


def family(variant: str, tests: list[Cell], specs: list[MarginSpec], alpha: float = ALPHA,
           time: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A variant's verdicts from its tests, one Holm family: estimate, the interval at the level
    Holm's last step used, the p-values at the margin and at 0 (raw and Holm-adjusted), and the
    verdict. ``time`` (`timeshare.timeshare`): a variant whose sides ran under measurably
    different machine load has its latency verdicts *undecided*, the cause in its line; one sent
    one after the other (or on another machine) says so in each latency verdict."""
    out: list[dict[str, Any]] = []
    hyp = [(k, d) for k, (_, _, ms, _) in enumerate(tests) for d in tested_values(ms)]
    pvals = [tests[k][3].p(d) if decides(tests[k][3], tests[k][2]) else None for k, d in hyp]
    _, level = holm_level(pvals, alpha)
    adj = holm(pvals)
    m = max(1, sum(p is not None for p in pvals))  # hypotheses with data: Holm's family
    need = pairs_needed(specs, m, alpha)
    for k, (lv, conc, ms, t) in enumerate(tests):
        p_of = {d: (p, a) for (kk, d), p, a in zip(hyp, pvals, adj, strict=True) if kk == k}
        iv = t.interval(level, tuple(p_of)) if decides(t, ms) else None
        e: dict[str, Any] = {
            "variant": variant, "metric": ms.metric, "margin": ms.value, "margin_text": ms.describe(),
            "unit": ms.unit, "higher_is_better": ms.higher_is_better, "pairs": t.n, "estimate": t.estimate,
            "ci": list(iv) if iv else None, "ci_level": 1 - level, "method": t.method,
            "statistic": statistic(ms), "failures": getattr(t, "failures", None),
            "paired_by": getattr(t, "paired_by", "case"),
            "weights": getattr(t, "weights", None),
            "p_margin": p_of[ms.value][0], "p_margin_holm": p_of[ms.value][1],
            "p_zero": p_of.get(0.0, (None, None))[0], "p_zero_holm": p_of.get(0.0, (None, None))[1],
            "hypotheses": m, "need_pairs": need, "level": lv, "concurrency": conc}
        if iv is None:
            e["verdict"], e["why"] = "inconclusive", (
                "too few pairs" if t.n < 2 else
                f"a {ms.metric} verdict needs at least {ms.min_pairs} pairs: its per-case values are too skewed "
                f"for fewer (docs/verdicts.md)" if t.n < ms.min_pairs else
                f"{t.n} pairs cannot bound the difference at this level")
        else:
            e["verdict"], e["why"] = _decide(iv, ms)
            if flips.is_flips(ms.metric) and e["verdict"] == "non-inferior":
                e["why"] = "the flip rate's whole interval lies below the margin"
        if e["verdict"] == "inconclusive" and decides(t, ms) and t.min_p() > alpha / m:
            e["why"] = (f"{t.n} pairs cannot decide: the smallest p they allow is {t.min_p():.3f}, and Holm "
                        f"over {m} hypotheses needs {alpha / m:.4f} or less: at least {need} pairs")
        if e["paired_by"] == "block" and e["verdict"] == "inconclusive" and t.n < need:
            e["why"] += ("; the pairs are the alternation's blocks (the cases of one block ran under one state "
                         "of the machine): more cases make more blocks")
        if ms.metric in LATENCY and time:
            timed(e, (time.get("machine") or {}).get(variant), (time.get("notes") or {}).get(variant))
        out.append(e)
    return out


def ledger_tests(ledger: Ledger, run_id: str, baseline: str | None, specs: list[MarginSpec],
                 by_level: bool = False) -> dict[str, list[Cell]]:
    """Each candidate's tests (`cells`), from the ledger's reduction of its first level beside the
    baseline's, or (``by_level``) of every level both reached (`Ledger.pair_inputs`: per case,
    never per request; a grader whose values are not declared is handed its grades of the two
    sides)."""
    levels = ledger.slice_levels(run_id)
    if not baseline or not specs:
        return {}
    # a baseline without a measured row still leaves each candidate's first-level margins, undecided
    # for want of pairs (a gate must not pass them); a sweep's levels need the baseline's
    plan = ([(lv, [v for v in sorted(levels) if v != baseline and lv in levels[v]])
             for lv in sorted(levels.get(baseline, ()))] if by_level else [(None, sorted(set(levels) - {baseline}))])
    pairs = [(lv, v, (baseline, (min(levels[baseline]) if lv is None else lv) if baseline in levels else -1,
                      v, min(levels[v]) if lv is None else lv)) for lv, names in plan for v in names]
    tests: dict[str, list[Cell]] = defaultdict(list)
    got = ledger.pair_inputs(run_id, [p for *_, p in pairs], **_reads(specs))
    for (lv, v, (*_, mine)), (inp, grades) in zip(pairs, got, strict=True):
        tests[v] += [(lv, mine, ms, input_test(inp, grades, baseline, v, ms)) for ms in specs]
    return dict(sorted(tests.items()))


def _reads(specs: list[MarginSpec]) -> dict[str, Any]:
    """What `Ledger.pair_inputs` reduces for ``specs``: the latency fields, each declared margin of
    their graders (both sides' `CaseValue`), the flips' graders, and the graders read as grades."""
    latency = {LATENCY[ms.metric][0]: LATENCY[ms.metric][1] for ms in specs if ms.metric in LATENCY}
    fl = sorted({flips.flip_metrics()[ms.metric] for ms in specs if flips.is_flips(ms.metric)})
    margins, grades = [], []
    for g in sorted(graders_read([ms for ms in specs if not flips.is_flips(ms.metric)])):
        mine, theirs = declared_case_values(available()[g], False), declared_case_values(available()[g], True)
        if mine is None or theirs is None:
            grades.append(g)
        else:
            margins += [(g, m, cv, theirs[m]) for m, cv in mine.items() if m in theirs]
    return {"latency": list(latency.items()), "margins": margins, "flips": fl, "grades": grades}


def ledger_verdicts(ledger: Ledger, run_id: str, baseline: str | None, specs: list[MarginSpec],
                    time: dict[str, Any] | None = None, alpha: float = ALPHA, levels: bool | None = None
                    ) -> tuple[bool, list[dict[str, Any]]]:
    """(whether the run swept levels, its verdicts) from `ledger_tests`: each candidate's first level against the
    baseline's (the report's: ``levels`` False), or for a sweep (the gate's) every level both reached, one family."""
    swept = any(len(ls) > 1 for ls in ledger.slice_levels(run_id).values())
    tests = ledger_tests(ledger, run_id, baseline, specs, by_level=swept if levels is None else levels)
    return swept, [e for v, cs in tests.items() for e in family(v, cs, specs, alpha, time)]


def timed(e: dict[str, Any], cause: str | None, note: str | None) -> None:
    """A latency verdict told what the machine did: undecided when it moved under the verdict (the
    interval still printed: it measured the models and the machine together), noted when its sides
    ran apart in time or place."""
    if cause:
        e["verdict"], e["why"], e["machine"] = "undecided", cause, cause
    if note:
        e["timing_note"] = note
        e["why"] = f"{e['why']}; {note}"


def statistic(ms: MarginSpec) -> str:
    """What a margin's verdict is on, in words (docs/verdicts.md has the table)."""
    if flips.is_flips(ms.metric):
        return "flip rate"
    if ms.metric in LATENCY:
        what = "ratio of means" if ms.unit == "%" else "mean difference"
        return f"{what}, failed requests at the worst value"
    return "difference of pass rates" if ms.unit == "pp" else "mean difference per case"


def counts_text(e: dict[str, Any]) -> str:
    """'24 pairs, 2 failed (candidate 2, baseline 0)' for a verdict line."""
    f = e.get("failures") or {}
    bad = f.get("candidate", 0) + f.get("baseline", 0)
    tail = f", {bad} failed requests (candidate {f.get('candidate', 0)}, baseline {f.get('baseline', 0)})" \
        if e["metric"] in LATENCY else ""
    unit = " block pairs" if e.get("paired_by") == "block" else " pairs"
    return f"{e['pairs']}{unit}{tail}"


def fmt_estimate(e: dict[str, Any]) -> str:
    if not e.get("pairs"):  # nothing was paired: no estimate, never an interval
        return "no pairs"
    u = UNIT[e["unit"]]
    ci = e["ci"]
    est = "-" if e["estimate"] is None else f"{e['estimate']:+.3g}{u}"
    return est + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")


def level_text(level: float) -> str:
    """0.99375 -> '99.4 %'."""
    return f"{100 * level:.3g} %"


def sentences(vs: list[dict[str, Any]], baseline: str) -> list[str]:
    """The one-sentence verdict per variant that opens the report."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in vs:
        by[e["variant"]].append(e)
    out = []
    for v, es in by.items():
        parts = []
        for verdict in ("superior", "non-inferior", "inferior", "inconclusive", "undecided"):
            xs = [e for e in es if e["verdict"] == verdict]
            if xs:
                parts.append(f"{verdict} on " + ", ".join(f"{e['metric']} {fmt_estimate(e)} (margin {e['margin_text']}; "
                                                         f"{counts_text(e)}" + (f"; {e['machine']}" if e.get("machine")
                                                                                else "") + ")" for e in xs))
        most, need = max((e["pairs"] for e in es), default=0), max(e["need_pairs"] for e in es)
        tail = f"; {most} pairs cannot decide {len(es)} margins: at least {need} needed" if most < need else ""
        out.append(f"{v} vs {baseline}: " + "; ".join(parts) + tail + f" (intervals at {level_text(es[0]['ci_level'])}, "
                   f"the level of Holm's last step over {es[0]['hypotheses']} hypotheses: 5 % family-wise)")
    return out


# per-slice p-values of the quality tables that can flag a difference, the verdict text each
# flag is in, and how a flag begins: drift (grading/drift.py), KL − floor (grading/divergence.py)
SLICE_FLAGS = {"drift_p": ("drift_verdict", ("drift above", "drift below")),
               "kl_p": ("kl_verdict", ("above the batching floor", "below the batching floor"))}


def apply_holm(table: list[dict[str, Any]], pairs: list[dict[str, Any]], baseline: str | None,
               alpha: float = ALPHA) -> dict[str, dict[str, Any]]:
    """Chance controlled in the report's comparison tables: every test that can flag a difference
    between a variant and the baseline (latency per metric x slice, drift and KL per slice) is one family
    per variant under Holm. Each latency comparison's interval is printed at the level Holm's
    last step used, and its flag read from it; a drift flag that does not survive is shown as not
    a finding. Returns per variant: tests, flags that survive, flags raised unadjusted, and how
    many chance alone would give at that size."""
    out: dict[str, dict[str, Any]] = {}
    for v in dict.fromkeys([p["variant"] for p in pairs] + [r["variant"] for r in table if r["variant"] != baseline]):
        fam: list[tuple[dict[str, Any], str]] = [(p, "p") for p in pairs if p["variant"] == v]
        fam += [(r, k) for k in SLICE_FLAGS for r in table if r["variant"] == v and r.get(k) is not None]
        ps = [e[k] for e, k in fam]
        adj = holm(ps)
        _, level = holm_level(ps, alpha)
        raw_flags = held = 0
        for (e, k), a in zip(fam, adj, strict=True):
            e[f"{k}_holm"] = a
            if k == "p":
                raw_flags += e["p"] is not None and e["p"] <= alpha
                e["ci_level"] = 1 - level
                t = e.get("_test")
                if t is None:
                    continue
                iv = t.interval(level, (0.0,)) if t.n >= 2 else None
                e["ci_pct"] = list(iv) if iv else None
                e["verdict"] = flag(iv, v, e["metric"])
                held += e["verdict"] not in ("no clear difference", "n/a (too few pairs)")
                continue
            key, flags = SLICE_FLAGS[k]
            if not str(e.get(key) or "").startswith(flags):
                continue
            raw_flags += 1
            if a is not None and a <= alpha:
                held += 1
            else:
                e[key] = (f"not a finding: {e[key]} by its 95 % interval, but Holm-adjusted p "
                          f"{'-' if a is None else f'{a:.2f}'} > {alpha:g} (raw p {e[k]:.3f}) in a family of {len(fam)}")
        for e, _ in fam:
            e.pop("_test", None)
        kinds = {"p": "latency metrics x slices", "drift_p": "drift x slices", "kl_p": "KL x slices"}
        out[v] = {"tests": len(fam), "flags": held, "flags_unadjusted": raw_flags, "level": 1 - level,
                  "kinds": [name for k, name in kinds.items() if any(kk == k for _, kk in fam)],  # what was tested
                  "expected_by_chance": alpha * len(fam), "method": "Holm, two-sided sign-flip and bootstrap tests"}
    return out


def flag(iv: tuple[float, float] | None, v: str, metric: str) -> str:
    if iv is None:
        return "n/a (too few pairs)"
    up, down = (f"{v} faster", f"{v} slower") if metric == "out_tps" else (f"{v} slower", f"{v} faster")
    if iv[0] > 0:
        return up
    if iv[1] < 0:
        return down
    return "no clear difference"


def multiplicity_notes(m: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{v}: {x['tests']} difference tests against the baseline in this report ("
            f"{', '.join(x.get('kinds') or ['latency metrics x slices'])}); with no true difference chance alone "
            f"would flag {x['expected_by_chance']:.1f} of them "
            f"unadjusted; {x['method']} keep the chance of any false flag at {ALPHA:.0%} (latency intervals at "
            f"{level_text(x['level'])}): {x['flags']} flag(s) survive of {x['flags_unadjusted']} raised unadjusted"
            for v, x in m.items() if x["tests"]]
