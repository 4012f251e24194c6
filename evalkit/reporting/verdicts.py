"""Verdicts a team can act on: each candidate against the baseline, metric by metric, with a
margin the team chose: *superior*, *non-inferior*, *inferior* or *inconclusive*.

A margin is how much worse (in the metric's own unit: candidate minus baseline, paired by case)
the team accepts. Each metric gives one one-sided sign-flip test: against the margin from the
side its estimate falls on (non-inferior: the difference is better than the margin; inferior:
worse). The tests of one variant form a family, adjusted by Holm, so the chance that any verdict
of a variant is wrong stays at or below 5 %. Superior additionally needs the difference to be
better than 0 (its own Holm family). Definitions: docs/verdicts.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..grading.registry import available
from ..grading.registry import margins as grader_margins
from ..stats import bootstrap_ci, holm, mean, pairs_for_a_verdict, sign_flip_p

ALPHA = 0.05
# latency margins: paired by (case, repeat), lower is better except throughput
LATENCY = {"ttft_mean": ("ttft_ms", False), "tpot_mean": ("tpot_ms", False), "e2e_mean": ("e2e_ms", False),
           "itl_mean": ("itl_mean_ms", False), "out_tps_mean": ("out_tps", True)}
_VALUE = re.compile(r"^\s*([+-]?)\s*(\d+(?:\.\d+)?)\s*(pp|%|ms)?\s*$")


@dataclass
class MarginSpec:
    metric: str
    value: float  # in the metric's delta unit (pp, abs, % of the baseline mean, ms), signed: candidate − baseline
    unit: str  # "pp", "abs", "%", "ms"
    higher_is_better: bool
    text: str

    def describe(self) -> str:
        u = {"pp": " pp", "abs": "", "%": " %", "ms": " ms"}[self.unit]
        return f"{self.value:+g}{u}"


def known_metrics() -> dict[str, tuple[str, bool]]:
    """metric name -> (unit kind, higher is better), the graders' and the latency ones."""
    out = {k: ("latency", hib) for k, (_, hib) in LATENCY.items()}
    for name, (_, m) in grader_margins().items():
        out[name] = (m.unit, m.higher_is_better)
    return out


def parse_margins(spec: dict[str, Any] | str | None, where: str = "--margins") -> list[MarginSpec]:
    """`drift=0.05,schema_pass=-2pp,formality_mae=+0.2,e2e_mean=+0%` (or the same as a mapping).
    A bare number is the worsening allowed (sign taken from which way is worse); a signed one is
    used as written (e.g. e2e_mean=-10% asks for 10 % faster)."""
    if not spec:
        return []
    items = spec.items() if isinstance(spec, dict) else [p.partition("=")[::2] for p in spec.split(",") if p.strip()]
    known = known_metrics()
    out = []
    for key, raw in items:
        key = str(key).strip()
        if key not in known:
            raise UsageError(f"{where}: unknown metric '{key}' (known: {', '.join(sorted(known))})")
        kind, hib = known[key]
        m = _VALUE.match(str(raw))
        if not m:
            raise UsageError(f"{where}: '{key}={raw}': expected a number, optionally signed, with pp, % or ms")
        sign, num, unit = m.group(1), float(m.group(2)), m.group(3)
        if kind == "latency":
            unit = unit or "%"
            if unit == "pp":
                raise UsageError(f"{where}: '{key}={raw}': a latency margin is in % or ms")
        elif kind == "pp":
            if unit not in (None, "pp"):
                raise UsageError(f"{where}: '{key}={raw}': a pass-rate margin is in percentage points (pp)")
            unit = "pp"
        elif unit is not None:
            raise UsageError(f"{where}: '{key}={raw}': this metric takes a plain number")
        else:
            unit = "abs"
        value = -num if sign == "-" else num if sign == "+" else (-num if hib else num)
        out.append(MarginSpec(key, value, unit, hib, f"{key}={raw}"))
    return out


def _pairs(rows: list[dict[str, Any]], baseline: str, variant: str, ms: MarginSpec) -> tuple[list[float], float | None]:
    """Per-case differences (candidate − baseline) for one margin, and the scale a % margin takes."""
    if ms.metric in LATENCY:
        field = LATENCY[ms.metric][0]
        idx = {(r["variant"], r["case_id"], r["repeat"]): r for r in rows if r["error_class"] is None}
        diffs, base = [], []
        for (v, case, rep), r in idx.items():
            b = idx.get((baseline, case, rep))
            if v == variant and b is not None and r[field] is not None and b[field] is not None:
                diffs.append(r[field] - b[field])
                base.append(b[field])
        return diffs, mean(base)
    grader, _ = grader_margins()[ms.metric]
    cls = available()[grader]

    def grades(v: str) -> list[dict[str, Any]]:
        return [{**r["grades"][grader], "case_id": r["case_id"]} for r in rows
                if r["variant"] == v and grader in r["grades"]]

    return cls.margin_pairs(grades(variant), grades(baseline)).get(ms.metric, []), None


def verdicts(rows: list[dict[str, Any]], baseline: str | None, specs: list[MarginSpec]) -> list[dict[str, Any]]:
    """One entry per candidate variant and margin: estimate, 95 % interval, the Holm-adjusted
    p-value behind the verdict, and the verdict."""
    if not baseline or not specs:
        return []
    out: list[dict[str, Any]] = []
    for variant in sorted({r["variant"] for r in rows} - {baseline}):
        fam = []
        for ms in specs:
            diffs, base_mean = _pairs(rows, baseline, variant, ms)
            scale = (100.0 / base_mean) if ms.unit == "%" and base_mean else 1.0
            if ms.unit == "%" and not base_mean:
                diffs = []
            d = [x * scale for x in diffs]  # in the margin's unit
            est, ci = mean(d), bootstrap_ci(d)
            good = "greater" if ms.higher_is_better else "less"
            bad = "less" if ms.higher_is_better else "greater"
            better_than_margin = est is not None and ((est > ms.value) if ms.higher_is_better else (est < ms.value))
            p = sign_flip_p(d, ms.value, good if better_than_margin else bad)
            fam.append({"variant": variant, "metric": ms.metric, "margin": ms.value, "margin_text": ms.describe(),
                        "unit": ms.unit, "higher_is_better": ms.higher_is_better, "pairs": len(d), "estimate": est,
                        "ci95": list(ci) if ci else None, "p": p, "direction": "non-inferior" if better_than_margin
                        else "inferior", "p_superior": sign_flip_p(d, 0.0, good)})
        adj = holm([e["p"] for e in fam])
        adj_sup = holm([e["p_superior"] for e in fam])
        for e, a, s in zip(fam, adj, adj_sup, strict=True):
            e["p_holm"], e["p_superior_holm"] = a, s
            if a is None:
                e["verdict"] = "inconclusive"
                e["why"] = "too few pairs"
            elif a < ALPHA:
                e["verdict"] = "superior" if e["direction"] == "non-inferior" and s is not None and s < ALPHA \
                    else e["direction"]
                e["why"] = f"Holm-adjusted p {a:.3f}"
            elif e["pairs"] < (need := pairs_for_a_verdict(len(fam))):
                e["verdict"] = "inconclusive"
                e["why"] = (f"{e['pairs']} pairs cannot decide: the smallest p they allow is {2.0 ** -e['pairs']:.3f}, "
                            f"and Holm over {len(fam)} margins needs below {ALPHA / len(fam):.4f}: at least {need} pairs")
            else:
                e["verdict"] = "inconclusive"
                e["why"] = f"Holm-adjusted p {a:.3f} ≥ {ALPHA}: the interval reaches across the margin"
            out.append(e)
    return out


def _fmt(e: dict[str, Any]) -> str:
    u = {"pp": " pp", "abs": "", "%": " %", "ms": " ms"}[e["unit"]]
    ci = e["ci95"]
    est = "-" if e["estimate"] is None else f"{e['estimate']:+.3g}{u}"
    return est + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")


def sentences(vs: list[dict[str, Any]], baseline: str) -> list[str]:
    """The one-sentence verdict per variant that opens the findings."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in vs:
        by[e["variant"]].append(e)
    out = []
    for v, es in by.items():
        parts = []
        for verdict in ("superior", "non-inferior", "inferior", "inconclusive"):
            xs = [e for e in es if e["verdict"] == verdict]
            if xs:
                parts.append(f"{verdict} on " + ", ".join(f"{e['metric']} {_fmt(e)} (margin {e['margin_text']})"
                                                         for e in xs))
        most, need = max((e["pairs"] for e in es), default=0), pairs_for_a_verdict(len(es))
        tail = f"; {most} pairs cannot decide {len(es)} margins: at least {need} needed" if es and most < need else ""
        out.append(f"{v} vs {baseline}: " + "; ".join(parts) + tail + " (each verdict Holm-adjusted within the "
                   "variant, 5 % family-wise)")
    return out


def apply_holm(table: list[dict[str, Any]], pairs: list[dict[str, Any]], baseline: str | None,
               alpha: float = ALPHA) -> dict[str, dict[str, Any]]:
    """Chance controlled: every test in the report that can flag a difference between a variant
    and the baseline (latency per metric x slice, drift per slice) is one family per variant,
    adjusted by Holm. A flag whose adjusted p-value is not below ``alpha`` is shown as not
    surviving, never as a finding. Returns per variant: tests, flags that survive, flags that
    would have been raised unadjusted, and how many chance alone would give at that size."""
    out: dict[str, dict[str, Any]] = {}
    for v in dict.fromkeys([p["variant"] for p in pairs] + [r["variant"] for r in table if r["variant"] != baseline]):
        fam: list[tuple[dict[str, Any], str, str]] = [(p, "p", "verdict") for p in pairs if p["variant"] == v]
        fam += [(r, "drift_p", "drift_verdict") for r in table if r["variant"] == v and r.get("drift_p") is not None]
        adj = holm([e[k] for e, k, _ in fam])
        raw_flags = held = 0
        for (e, k, vk), a in zip(fam, adj, strict=True):
            e[f"{k}_holm"] = a
            claims = bool(e.get(vk)) and (e[vk].startswith(("drift above", "drift below")) or
                                         (vk == "verdict" and e[vk] not in ("no clear difference",)
                                          and not e[vk].startswith("n/a")))
            if not claims:
                continue
            raw_flags += 1
            if a is not None and a < alpha:
                held += 1
            else:
                e[vk] = (f"not a finding: {e[vk]} by its interval, but Holm-adjusted p "
                         f"{'-' if a is None else f'{a:.2f}'} ≥ {alpha:g} (raw p {e[k]:.3f}) in a family of {len(fam)}")
        out[v] = {"tests": len(fam), "flags": held, "flags_unadjusted": raw_flags,
                  "expected_by_chance": alpha * len(fam), "method": "Holm, two-sided sign-flip tests"}
    return out


def multiplicity_notes(m: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{v}: {x['tests']} difference tests against the baseline in this report (latency metrics x slices, "
            f"drift x slices); with no true difference chance alone would flag {x['expected_by_chance']:.1f} of them "
            f"unadjusted; {x['method']} keeps the chance of any false flag at {ALPHA:.0%}: {x['flags']} flag(s) "
            f"survive of {x['flags_unadjusted']} raised by their intervals" for v, x in m.items() if x["tests"]]
