"""One self-contained HTML file (inline SVG, no scripts, no CDN) with the findings and plots.
Generated text is untrusted: every string from the ledger is HTML-escaped."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any

from ..grading.registry import available, headline_columns
from ..host import host_line
from ..ledger import Ledger
from ..stats import percentile
from . import svgplot
from .findings import findings, request_rows
from .report import COLUMNS, SERVER_COLUMNS, build_report, quality_columns, table_cells

CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
td:first-child,td:nth-child(2),th{text-align:left}th{background:#f4f4f4}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots figure{margin:0}.plots svg{border:1px solid #eee}
pre{white-space:pre-wrap;background:#f8f8f8;padding:8px;font-size:12px;max-height:220px;overflow:auto}
.note{color:#666;font-size:12px}.spike{font-family:monospace;font-size:12px}
"""


def _table(header: list[str], body: list[list[Any]]) -> str:
    h = "".join(f"<th>{escape(str(x))}</th>" for x in header)
    rows = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><tr>{h}</tr>{rows}</table>"


def _f(v: Any, d: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"[{v[0]:+.{d}f}, {v[1]:+.{d}f}]"
    return f"{v:,.{d}f}" if isinstance(v, (int, float)) else str(v)


def plots(ledger: Ledger, run_id: str, rows: list[dict[str, Any]], spikes: list[dict[str, Any]],
          report: dict[str, Any], levels: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    ok = [r for r in rows if r["error_class"] is None]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out: list[tuple[str, str]] = []
    for cx in ("short", "medium", "long"):
        samples = {v: [r["ttft_ms"] for r in ok if r["variant"] == v and r["complexity"] == cx] for v in variants}
        if any(samples.values()):
            out.append((f"TTFT CDF, {cx}", svgplot.cdf(f"TTFT CDF — {cx} prompts", "TTFT (ms)", samples)))
    groups = {f"{v}/{cx[0]}": [r["e2e_ms"] for r in ok if r["variant"] == v and r["complexity"] == cx]
              for v in variants for cx in ("short", "medium", "long")}
    out.append(("E2E distributions", svgplot.boxes("E2E by variant / complexity (s, m, l)", "E2E (ms)", groups)))
    spiked = {s["request_id"] for s in spikes}
    series = {v: [(r["prompt_tokens"], r["ttft_ms"]) for r in ok if r["variant"] == v and r["prompt_tokens"]]
              for v in variants}
    marked = [(r["prompt_tokens"], r["ttft_ms"]) for r in ok if r["id"] in spiked and r["prompt_tokens"]]
    out.append(("TTFT vs prompt tokens", svgplot.scatter("TTFT vs prompt tokens (spikes circled)", "prompt tokens",
                                                         "TTFT (ms)", series, marked)))
    for metric, label in (("kv_cache_usage_perc", "KV-cache use (%)"), ("num_requests_waiting", "requests waiting"),
                          ("num_requests_running", "requests running")):
        ts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for x in ledger.server_series(run_id, metric):
            ts[x["variant"]].append((x["mono_ms"] / 1000.0, x["value"] * (100 if "perc" in metric else 1)))
        if ts:
            out.append((f"{label} timeline", svgplot.lines(f"{label} over the run", "seconds since the variant's start",
                                                           label, dict(ts), step=True)))
    levels = levels or []
    if len({lv["concurrency"] for lv in levels}) > 1:  # a sweep: where each variant stops meeting its SLOs
        slo = report["slo_ms"]
        if slo and any(lv["goodput_pct"] is not None for lv in levels):
            gp = {v: [(lv["concurrency"], lv["goodput_pct"]) for lv in levels if lv["variant"] == v]
                  for v in variants}
            out.append(("Goodput vs concurrency", svgplot.lines(
                "Goodput (requests meeting every SLO) vs concurrency", "concurrency", "goodput (%)", gp,
                ylim=(0, 100), hlines=[(99.0, "p99 of each SLO met")])))
        p99 = {v: [(lv["concurrency"], percentile([r["ttft_ms"] for r in ok if r["variant"] == v
                                                   and (r["phase"] or "main") == lv["phase"]], 99) or 0.0)
                    for lv in levels if lv["variant"] == v] for v in variants}
        out.append(("TTFT p99 vs concurrency", svgplot.lines(
            "TTFT p99 vs concurrency" + (" (dashed: the TTFT SLO)" if slo.get("ttft") else ""), "concurrency",
            "TTFT p99 (ms)", p99, hlines=[(slo["ttft"], f"SLO {slo['ttft']:,.0f} ms")] if slo.get("ttft") else None)))
    drift_rows = [r for r in report["rows"] if r["complexity"] == "all" and r["variant"] != report["baseline"]]
    if any(r.get("drift_mean") is not None for r in drift_rows):
        base = next((r for r in report["rows"] if r["variant"] == report["baseline"] and r["complexity"] == "all"), {})
        g = {r["variant"]: r["drift_mean"] for r in drift_rows}
        refs = {r["variant"]: base.get("floor_mean") for r in drift_rows}
        errs = {r["variant"]: (r["floor_mean"] + r["drift_minus_floor_ci95"][0], r["floor_mean"] + r["drift_minus_floor_ci95"][1])
                for r in drift_rows if r.get("drift_minus_floor_ci95") and r.get("floor_mean") is not None}
        out.append(("Drift vs noise floor", svgplot.bars("Drift (1 − cosine) vs the baseline; dashed: noise floor",
                                                         "drift", g, errs, refs)))
    for name, cls in available().items():  # each grader that asks for it: its value against a case field
        if not cls.scatter:
            continue
        fld, xl, yl = cls.scatter
        rng = random.Random(0)
        pts = {v: [(float(r[fld]) + rng.uniform(-0.15, 0.15), r["grades"][name]["value"] + rng.uniform(-0.15, 0.15))
                   for r in ok if r["variant"] == v and name in r["grades"] and r.get(fld) is not None
                   and r["grades"][name]["value"] is not None] for v in variants}
        if any(pts.values()):
            title = f"{name.capitalize()}: {xl} vs {yl} (jittered)"
            out.append((title, svgplot.scatter(title, xl, yl, pts)))
    return out


def render_html(ledger: Ledger, run_id: str | None = None) -> str:
    report = build_report(ledger, run_id)
    rid = report["run"]["id"]
    f = findings(ledger, rid)
    rows = request_rows(ledger, rid)
    run = report["run"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>evalkit run {escape(rid)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>evalkit — {escape(run['matrix_name'])}</h1>",
             f"<p class='note'>run {escape(rid)} · created {escape(run['created_at'])} · status {escape(run['status'])} "
             f"· baseline <b>{escape(str(report['baseline']))}</b> · dataset {escape(run['dataset_hash'][:12])}</p>",
             f"<p class='note'><b>{escape(host_line(report.get('host')))}</b></p>"]
    if report.get("host_warning"):
        parts.append(f"<p class='note'><b>{escape(report['host_warning'])}</b></p>")
    parts.append(_table(["variant", "model", "engine", "dtype", "quantization", "status", "server ready (s)"],
                        [[v["name"], v["model"] or "", v["engine_version"] or v["engine"],
                          (v.get("dtype") or "-") + (f" ({v['dtype_reason']})" if v.get("dtype_reason") else ""),
                          v["quantization"] or "none", v["status"], _f(v["ready_s"], 0)] for v in report["variants"]]))
    parts.append("<h2>Summary (as in the study)</h2>")
    heads = headline_columns(report["graders"])
    parts.append(_table(
        ["variant", "n", "err", "TTFT tax short %", "medium %", "long % [95% CI]", "E2E Δ medium % [95% CI]",
         "TTFT max ms", "KV peak %", "KV mean %", "preempt", *(c.label for c in heads)],
        [[s["variant"] + (" (baseline)" if s["is_baseline"] else ""), s["n"], s["errors"],
          _f(s["ttft_tax_short_pct"], 1), _f(s["ttft_tax_medium_pct"], 1),
          f"{_f(s['ttft_tax_long_pct'], 1)} {_f(s['ttft_tax_long_ci95_pct'], 1)}",
          f"{_f(s['e2e_delta_medium_pct'], 1)} {_f(s['e2e_delta_medium_ci95_pct'], 1)}", _f(s["ttft_max_ms"]),
          _f(s["kv_cache_peak_pct"], 1), _f(s["kv_cache_mean_pct"], 1), _f(s["preemptions"]),
          *(_f(s.get(c.key), c.digits or 0) for c in heads)] for s in f["study_summary"]]))
    parts.append("<h2>Plots</h2><div class='plots'>")
    parts += [f"<figure><figcaption class='note'>{escape(t)}</figcaption>{svg}</figure>"
              for t, svg in plots(ledger, rid, rows, f["spikes"], report, f["load_levels"])]
    parts.append("</div>")
    for title, cols in (("Latency (ms)", COLUMNS), ("What the server did (ms)", SERVER_COLUMNS),
                        ("Quality", quality_columns(report["graders"]))):
        header, body = table_cells(report, cols)
        parts += [f"<h2>{escape(title)}</h2>", _table(header, body)]
    parts.append("<h2>Paired comparisons against the baseline (same case, same seed)</h2>"
                 "<p class='note'>Mean difference with a 95% bootstrap interval; a verdict only where the "
                 "interval excludes 0.</p>")
    parts.append(_table(["variant", "slice", "metric", "pairs", "baseline mean", "Δ", "Δ %", "95% CI (%)", "verdict"],
                        [[p["variant"], p["complexity"], p["metric"], p["pairs"], _f(p["baseline_mean"], 1),
                          _f(p["delta"], 1), _f(p["delta_pct"], 1), _f(p["ci95_pct"], 1), p["verdict"]]
                         for p in f["paired"]]))
    parts.append("<h2>Spikes (median + 3.5 × MAD per variant × complexity)</h2>")
    parts.append("".join(f"<div class='spike'>{escape(s['line'])}</div>" for s in f["spikes"]) or
                 "<p class='note'>no spikes</p>")
    parts.append("<h2>Capacity</h2>")
    parts.append(_table(["variant", "KV tokens", "block size", "max concurrent (short/medium/long)",
                         "engine max concurrency", "measured saturation", "max tested"],
                        [[c["variant"], _f(c.get("kv_tokens")), _f(c.get("block_size")),
                          "/".join(str(c.get("max_concurrent_by_complexity", {}).get(x, "-"))
                                   for x in ("short", "medium", "long")),
                          c.get("engine_max_concurrency") or "-", c.get("measured_saturation_concurrency") or "not reached",
                          c.get("max_concurrency_tested") or "-"] for c in f["capacity"]]))
    if f["cost"]:
        parts.append("<h2>Cost per token</h2><p class='note'>The variant's price per hour over the throughput it "
                     "reached at each load level (the machine assumed busy at that level); ★ the highest level "
                     "that still meets the SLOs.</p>")
        parts.append(_table(["variant", "level", "meets SLOs", "output tok/s", "$/hour", "$ per M output tokens",
                             "$ per 1k requests", "reference $ per 1k requests", "break-even requests/hour"],
                            [[c["variant"] + (" ★" if c.get("best_level") else ""), c["phase"],
                              {True: "yes", False: "no", None: "-"}[c["meets_slo"]], _f(c["output_tps"], 1),
                              _f(c["usd_per_hour"], 2), _f(c["usd_per_m_output_tokens"], 2),
                              _f(c["usd_per_1k_requests"], 3),
                              f"{_f(c.get('reference_usd_per_1k_requests'), 3)} ({c.get('reference') or '-'})",
                              _f(c.get("break_even_requests_per_hour"), 0)] for c in f["cost"]]))
    parts.append("<h2>Sample outputs (verbatim, escaped)</h2>")
    seen = set()
    for r in rows:
        if r["case_id"] in seen or len(seen) >= 3:
            continue
        seen.add(r["case_id"])
        for x in (y for y in rows if y["case_id"] == r["case_id"] and y["repeat"] == 0):
            parts.append(f"<p class='note'>{escape(x['variant'])} · {escape(x['case_id'])}</p>"
                         f"<pre>{escape(x['text'] or x['error'] or '')}</pre>")
    parts.append(f"<p class='note'>definitions: docs/metrics.md · load: {escape(json.dumps(report['load']))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(ledger: Ledger, path: Path, run_id: str | None = None) -> Path:
    html = render_html(ledger, run_id)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)  # never a half-written report
    return path
