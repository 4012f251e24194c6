"""The HTML report's charts, one colour per variant across all of them (svgplot.color_map)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from ..grading.registry import available
from ..ledger import Ledger
from ..ledger.chart_reads import COMPLEXITIES, Bands, ChartSeries
from . import svgplot
from .load_curve import curve_plots
from .spike_summary import spike_set
from .token_plots import MIN_CASES, divergence_plots

# the graders whose pass/fail makes the quality score of the quality-vs-speed/price charts
QUALITY_GRADERS = ("schema", "persona", "formality")
BINS = 40  # a large scatter's bands: x in this many bins (or its own values, where it has no more)
JITTER = 0.15  # a scatter of levels (1-5 and the like) is jittered this far each way, x and y


def frontier(points: dict[str, tuple[float, float]], higher_x: bool) -> set[str]:
    """The Pareto set: points no other beats on both quality (y, higher) and x (higher or lower)."""
    out = set()
    for k, (x, y) in points.items():
        beaten = any((y2 >= y and (x2 >= x if higher_x else x2 <= x)) and (y2 > y or x2 != x)
                     for k2, (x2, y2) in points.items() if k2 != k)
        if not beaten:
            out.add(k)
    return out


def quality_points(scores: list[dict[str, Any]], cost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and load level with a quality score (`capacity.load_levels`' second list: % of
    its outputs passing schema, persona and formality, output tokens/s per user) its $ per million
    output tokens; which are on the frontier (`mark_frontier`)."""
    usd = {(c["variant"], c["level"]): c["usd_per_m_output_tokens"] for c in cost}
    return mark_frontier([{**e, "usd_per_m_output_tokens": usd.get((e["variant"], e["level"]))} for e in scores])


def mark_frontier(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which points are on the speed and the price frontier, over every variant's points."""
    key = {f"{e['variant']} c={e['concurrency']}": e for e in out}
    fast = frontier({k: (e["tps_per_user"], e["quality_pct"]) for k, e in key.items() if e["tps_per_user"]}, True)
    cheap = frontier({k: (e["usd_per_m_output_tokens"], e["quality_pct"]) for k, e in key.items()
                      if e["usd_per_m_output_tokens"]}, False)
    for k, e in key.items():
        e["pareto_speed"], e["pareto_price"] = k in fast, k in cheap
    return out


def plots(ledger: Ledger, run_id: str, f: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str]]:
    """The charts, each drawn from its series as the ledger's queries give them (`ChartSeries`):
    the report holds a chart's points, not the run's rows."""
    present = list(ledger.slice_levels(run_id))
    variants = list(dict.fromkeys(v["name"] for v in report["variants"])) or present
    scatter = {name: cls.aggregate.scatter for name, cls in available().items() if cls.aggregate.scatter}
    data = ledger.chart_series(run_id, variants, spike_set(f["spikes"]).request_ids(),
                               {name: fld for name, (fld, _, _) in scatter.items()},
                               len({lv["concurrency"] for lv in f["load_levels"]}) > 1, svgplot.MAX_POINTS, BINS,
                               MIN_CASES)
    return draw(ledger, run_id, data, scatter, f, report, variants)


def draw(ledger: Ledger, run_id: str, data: ChartSeries, scatter: dict[str, tuple[str, str, str]], f: dict[str, Any],
         report: dict[str, Any], variants: list[str]) -> list[tuple[str, str]]:
    cols = svgplot.color_map(variants)
    out: list[tuple[str, str]] = []
    for cx in COMPLEXITIES:
        if any(data.n.get((v, cx)) for v in variants):
            ranked = {v: data.cdf.get((v, cx), (0, [])) for v in variants}
            out.append((f"TTFT CDF, {cx}", svgplot.cdf(f"TTFT CDF — {cx} prompts", "TTFT (ms)", ranked, cols)))
    if data.by_complexity:
        owner = {f"{v}/{cx[0]}": v for v in variants for cx in COMPLEXITIES}
    else:  # a workload without the shipped complexity: one box a variant, over all its cases
        owner = {v: v for v in variants}
    out.append(("E2E distributions", svgplot.boxes(
        "E2E by variant / complexity (s, m, l)" if data.by_complexity else
        "E2E by variant (the cases have no complexity)", "E2E (ms)", {k: data.boxes.get(k) for k in owner},
        data.box_values, cols, owner)))
    title = "TTFT vs prompt tokens (spikes circled)"
    out.append(("TTFT vs prompt tokens", _xy(title, "prompt tokens", "TTFT (ms)", data.tok, data.marked, cols)))
    for metric, label in (("kv_cache_usage_perc", "KV-cache use (%)"), ("num_requests_waiting", "requests waiting"),
                          ("num_requests_running", "requests running")):
        ts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for x in ledger.server_series(run_id, metric):
            ts[x["variant"]].append((x["mono_ms"] / 1000.0, x["value"] * (100 if "perc" in metric else 1)))
        if ts:
            out.append((f"{label} timeline", svgplot.lines(f"{label} over the run", "seconds since the variant's start",
                                                           label, dict(ts), step=True, colors=cols)))
    out += capacity_plots(data, f, report, variants, cols)
    out += curve_plots(f["load_levels"], variants, cols)  # the knee and first saturated level marked
    out += quality_plots(data, scatter, f, report, variants, cols)
    out += divergence_plots(data.kl, variants, cols)  # KL along the answer
    return out


def _xy(title: str, xl: str, yl: str, s: dict[str, list[tuple[float, float]]] | Bands,
        marked: list[tuple[float, float]] | None, cols: dict[str, str]) -> str:
    """A scatter's points, or its bands where they are too many to draw."""
    if isinstance(s, Bands):
        return svgplot.bands(title, xl, yl, s, marked, cols, BINS)
    return svgplot.scatter(title, xl, yl, s, marked, cols)


def jittered(series: dict[str, list[tuple[float, float]]], seed: int = 0) -> dict[str, list[tuple[float, float]]]:
    """Points of levels (1-5 and the like) moved by up to JITTER each way, x then y, one stream
    (``seed``) through the variants in order, so points on the same level can be told apart."""
    rng = random.Random(seed)
    u = rng.uniform
    return {v: [(float(x) + u(-JITTER, JITTER), y + u(-JITTER, JITTER)) for x, y in pts] for v, pts in series.items()}


def capacity_plots(data: ChartSeries, f: dict[str, Any], report: dict[str, Any], variants: list[str],
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
    p99 = {v: [(lv["concurrency"], data.p99.get((v, lv["level"]), 0.0)) for lv in levels if lv["variant"] == v]
           for v in variants}
    out.append(("TTFT p99 vs concurrency", svgplot.lines(
        "TTFT p99 vs concurrency" + (" (dashed: the TTFT SLO)" if slo.get("ttft") else ""), "concurrency",
        "TTFT p99 (ms)", p99, hlines=[(slo["ttft"], f"SLO {slo['ttft']:,.0f} ms")] if slo.get("ttft") else None,
        colors=cols, vlines=pred)))
    return out


def quality_plots(data: ChartSeries, scatter: dict[str, tuple[str, str, str]], f: dict[str, Any],
                  report: dict[str, Any], variants: list[str], cols: dict[str, str]) -> list[tuple[str, str]]:
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
    for name, (_, xl, yl) in scatter.items():  # each grader that asks: its value against a row or case field
        pts = data.scatter.get(name)
        if isinstance(pts, Bands):
            title = f"{name.capitalize()}: {xl} vs {yl}"
            out.append((title, svgplot.bands(title, xl, yl, pts, None, cols, BINS)))
        elif pts and any(pts.values()):
            title = f"{name.capitalize()}: {xl} vs {yl} (jittered)"
            out.append((title, svgplot.scatter(title, xl, yl, jittered(pts), colors=cols)))
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
