"""The HTML report's charts, one colour per variant across all of them (svgplot.color_map)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from ..grading.registry import available
from ..ledger import Ledger
from ..stats import mean, percentile
from . import svgplot
from .load_curve import curve_plots
from .token_plots import divergence_plots

# the graders whose pass/fail makes the quality score of the quality-vs-speed/price charts
QUALITY_GRADERS = ("schema", "persona", "formality")


def quality_pass(r: dict[str, Any]) -> bool | None:
    """One output passes the quality score when every default pass/fail grader it has passed it."""
    got = [r["grades"][g]["passed"] for g in QUALITY_GRADERS if g in r["grades"] and r["grades"][g]["passed"] is not None]
    return all(got) if got else None


def frontier(points: dict[str, tuple[float, float]], higher_x: bool) -> set[str]:
    """The Pareto set: points no other beats on both quality (y, higher) and x (higher or lower)."""
    out = set()
    for k, (x, y) in points.items():
        beaten = any((y2 >= y and (x2 >= x if higher_x else x2 <= x)) and (y2 > y or x2 != x)
                     for k2, (x2, y2) in points.items() if k2 != k)
        if not beaten:
            out.add(k)
    return out


def quality_vs_cost(rows: list[dict[str, Any]], levels: list[dict[str, Any]], cost: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Per variant and load level: the quality score (% of outputs passing schema, persona and
    formality), output tokens/s per user, $ per million output tokens; which are on the frontier."""
    return mark_frontier(quality_points(rows, levels, cost))


def quality_points(rows: list[dict[str, Any]], levels: list[dict[str, Any]], cost: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """`quality_vs_cost`'s points before the frontier: a variant's rows give its own points."""
    usd = {(c["variant"], c["level"]): c["usd_per_m_output_tokens"] for c in cost}
    out = []
    for lv in levels:
        rs = [r for r in rows if r["variant"] == lv["variant"] and (r["level"] or "main") == lv["level"]
              and r["error_class"] is None]
        q = [x for r in rs if (x := quality_pass(r)) is not None]
        if not q:
            continue
        out.append({"variant": lv["variant"], "level": lv["level"], "concurrency": lv["concurrency"],
                    "quality_pct": 100.0 * sum(q) / len(q), "tps_per_user": mean([r["out_tps"] for r in rs]),
                    "usd_per_m_output_tokens": usd.get((lv["variant"], lv["level"]))})
    return out


def mark_frontier(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which points are on the speed and the price frontier, over every variant's points."""
    key = {f"{e['variant']} c={e['concurrency']}": e for e in out}
    fast = frontier({k: (e["tps_per_user"], e["quality_pct"]) for k, e in key.items() if e["tps_per_user"]}, True)
    cheap = frontier({k: (e["usd_per_m_output_tokens"], e["quality_pct"]) for k, e in key.items()
                      if e["usd_per_m_output_tokens"]}, False)
    for k, e in key.items():
        e["pareto_speed"], e["pareto_price"] = k in fast, k in cheap
    return out


def plots(ledger: Ledger, run_id: str, rows: list[dict[str, Any]], f: dict[str, Any],
          report: dict[str, Any]) -> list[tuple[str, str]]:
    ok = [r for r in rows if r["error_class"] is None]
    variants = list(dict.fromkeys(v["name"] for v in report["variants"])) or list(dict.fromkeys(r["variant"] for r in rows))
    cols = svgplot.color_map(variants)
    out: list[tuple[str, str]] = []
    for cx in ("short", "medium", "long"):
        samples = {v: [r["ttft_ms"] for r in ok if r["variant"] == v and r["complexity"] == cx] for v in variants}
        if any(samples.values()):
            out.append((f"TTFT CDF, {cx}", svgplot.cdf(f"TTFT CDF — {cx} prompts", "TTFT (ms)", samples, cols)))
    groups = {f"{v}/{cx[0]}": [r["e2e_ms"] for r in ok if r["variant"] == v and r["complexity"] == cx]
              for v in variants for cx in ("short", "medium", "long")}
    owner = {f"{v}/{cx[0]}": v for v in variants for cx in ("short", "medium", "long")}
    out.append(("E2E distributions", svgplot.boxes("E2E by variant / complexity (s, m, l)", "E2E (ms)", groups, cols,
                                                   owner)))
    spiked = {s["request_id"] for s in f["spikes"]}
    series = {v: [(r["prompt_tokens"], r["ttft_ms"]) for r in ok if r["variant"] == v and r["prompt_tokens"]]
              for v in variants}
    marked = [(r["prompt_tokens"], r["ttft_ms"]) for r in ok if r["id"] in spiked and r["prompt_tokens"]]
    out.append(("TTFT vs prompt tokens", svgplot.scatter("TTFT vs prompt tokens (spikes circled)", "prompt tokens",
                                                         "TTFT (ms)", series, marked, cols)))
    for metric, label in (("kv_cache_usage_perc", "KV-cache use (%)"), ("num_requests_waiting", "requests waiting"),
                          ("num_requests_running", "requests running")):
        ts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for x in ledger.server_series(run_id, metric):
            ts[x["variant"]].append((x["mono_ms"] / 1000.0, x["value"] * (100 if "perc" in metric else 1)))
        if ts:
            out.append((f"{label} timeline", svgplot.lines(f"{label} over the run", "seconds since the variant's start",
                                                           label, dict(ts), step=True, colors=cols)))
    out += capacity_plots(ok, f, report, variants, cols)
    out += curve_plots(f["load_levels"], variants, cols)  # the knee and first saturated level marked
    out += quality_plots(ok, f, report, variants, cols)
    out += divergence_plots(ok, variants, cols)  # KL along the answer (reporting/token_plots.py)
    return out


def capacity_plots(ok: list[dict[str, Any]], f: dict[str, Any], report: dict[str, Any], variants: list[str],
                   cols: dict[str, str]) -> list[tuple[str, str]]:
    """A sweep: goodput and TTFT p99 against concurrency, every variant on one chart, each
    variant's predicted capacity (requests its KV cache holds at once) marked."""
    levels = f["load_levels"]
    if len({lv["concurrency"] for lv in levels}) <= 1:
        return []
    out = []
    pred = [(c["max_concurrency_predicted"], f"{c['variant']} fits {c['max_concurrency_predicted']}", c["variant"])
            for c in f["capacity"] if c.get("max_concurrency_predicted")]
    if any(lv["goodput_pct"] is not None for lv in levels):
        gp = {v: [(lv["concurrency"], lv["goodput_pct"]) for lv in levels if lv["variant"] == v] for v in variants}
        out.append(("Goodput vs concurrency", svgplot.lines(
            "Goodput (requests meeting every SLO) vs concurrency; dotted: predicted capacity", "concurrency",
            "goodput (%)", gp, ylim=(0, 100), colors=cols, vlines=pred)))
    slo = report["slo_ms"]
    p99 = {v: [(lv["concurrency"], percentile([r["ttft_ms"] for r in ok if r["variant"] == v
                                               and (r["level"] or "main") == lv["level"]], 99) or 0.0)
                for lv in levels if lv["variant"] == v] for v in variants}
    out.append(("TTFT p99 vs concurrency", svgplot.lines(
        "TTFT p99 vs concurrency" + (" (dashed: the TTFT SLO)" if slo.get("ttft") else ""), "concurrency",
        "TTFT p99 (ms)", p99, hlines=[(slo["ttft"], f"SLO {slo['ttft']:,.0f} ms")] if slo.get("ttft") else None,
        colors=cols, vlines=pred)))
    return out


def quality_plots(ok: list[dict[str, Any]], f: dict[str, Any], report: dict[str, Any], variants: list[str],
                  cols: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    drift_rows = [r for r in report["rows"] if r["complexity"] == "all" and r["variant"] != report["baseline"]]
    if any(r.get("drift_mean") is not None for r in drift_rows):
        base = next((r for r in report["rows"] if r["variant"] == report["baseline"] and r["complexity"] == "all"), {})
        g = {r["variant"]: r["drift_mean"] for r in drift_rows}
        refs = {r["variant"]: base.get("floor_mean") for r in drift_rows}
        errs = {r["variant"]: (r["floor_mean"] + r["drift_minus_floor_ci95"][0],
                               r["floor_mean"] + r["drift_minus_floor_ci95"][1])
                for r in drift_rows if r.get("drift_minus_floor_ci95") and r.get("floor_mean") is not None}
        out.append(("Drift vs noise floor", svgplot.bars("Drift (1 − cosine) vs the baseline; dashed: noise floor",
                                                         "drift", g, errs, refs, cols)))
    for name, cls in available().items():  # each grader that asks for it: its value against a case field
        if not cls.aggregate.scatter:
            continue
        fld, xl, yl = cls.aggregate.scatter
        rng = random.Random(0)
        pts = {v: [(float(r[fld]) + rng.uniform(-0.15, 0.15), r["grades"][name]["value"] + rng.uniform(-0.15, 0.15))
                   for r in ok if r["variant"] == v and name in r["grades"] and r.get(fld) is not None
                   and r["grades"][name]["value"] is not None] for v in variants}
        if any(pts.values()):
            title = f"{name.capitalize()}: {xl} vs {yl} (jittered)"
            out.append((title, svgplot.scatter(title, xl, yl, pts, colors=cols)))
    qc = f.get("quality_vs_cost") or []
    for xkey, flag, xl, title in (("tps_per_user", "pareto_speed", "output tokens/s per user",
                                   "Quality vs speed per user (labelled: the Pareto set)"),
                                  ("usd_per_m_output_tokens", "pareto_price", "$ per million output tokens",
                                   "Quality vs price (labelled: the Pareto set)")):
        pts = {v: [(e[xkey], e["quality_pct"]) for e in qc if e["variant"] == v and e[xkey]] for v in variants}
        if any(pts.values()):
            labels = [(e[xkey], e["quality_pct"], f"{e['variant']} c={e['concurrency']}") for e in qc
                      if e.get(flag) and e[xkey]]
            out.append((title, svgplot.scatter(title, xl, "quality: % passing schema, persona, formality", pts,
                                               colors=cols, labels=labels)))
    return out
