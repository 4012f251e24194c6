"""One self-contained HTML file (inline SVG, no scripts, no CDN) with the findings and plots.
Generated text is untrusted: every string from the ledger is HTML-escaped."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from ..catalogue import STUDY, cell, fmt
from ..grading.registry import headline_columns
from ..host import host_line
from ..ledger import Ledger
from ..spec.sizes import human
from .by_attr import by_html
from .document import flips_table
from .findings import full_report
from .plots import plots
from .report import latency_columns, quality_columns, server_columns, table_cells
from .spike_summary import count_lines
from .verdicts import multiplicity_notes

SPIKES_LISTED = 50  # the page lists the largest; the rest are one command away
# what `full_report` returns: the report, its findings, the rows they read
Read = tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]

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
    return fmt(None, v, d)


def _verdicts(f: dict[str, Any]) -> list[str]:
    parts = []
    if f["verdict_lines"]:
        parts.append("<h2>Verdicts</h2><p class='note'>Each metric against the margin the team chose (candidate − "
                     "baseline, paired by case): superior, non-inferior, inferior or inconclusive, read from the "
                     "interval at the level of Holm's last step within each variant, so verdict and interval agree "
                     "(docs/verdicts.md).</p>")
        parts += [f"<p><b>{escape(line)}</b></p>" for line in f["verdict_lines"]]
        parts.append(_table(["variant", "metric", "margin", "pairs", "estimate", "interval", "level", "Holm p at margin",
                             "verdict"],
                            [[e["variant"], e["metric"], e["margin_text"], e["pairs"], _f(e["estimate"], 3),
                              _f(e["ci"], 3), f"{100 * e['ci_level']:.3g} %", _f(e["p_margin_holm"], 3), e["verdict"]]
                             for e in f["verdicts"]]))
    for line in (f.get("multiplicity_notes") or []):
        parts.append(f"<p class='note'>{escape(line)}</p>")
    return parts


def _capacity(f: dict[str, Any]) -> list[str]:
    parts = ["<h2>Capacity</h2>"]
    parts += [f"<p><b>{escape(line)}</b></p>" for line in f["capacity_statement"]]
    parts.append(_table(["variant", "memory budget", "weights", "KV cache", "KV blocks × size", "KV tokens",
                         "predicted max concurrency", "max concurrent (short/medium/long)", "saturated at (why)",
                         "SLO held up to", "max tested"],
                        [[c["variant"], human(c.get("memory_budget_bytes")) if c.get("memory_budget_bytes") else "-",
                          human(c.get("weight_bytes")), human(c.get("kv_bytes")),
                          f"{_f(c.get('blocks'))} × {_f(c.get('block_size'))}", _f(c.get("kv_tokens")),
                          _f(c.get("max_concurrency_predicted")),
                          "/".join(str(c.get("max_concurrent_by_complexity", {}).get(x, "-"))
                                   for x in ("short", "medium", "long")),
                          (f"{c['saturated_at']} ({c.get('saturation_reason') or '-'})" if c.get("saturated_at")
                           else "not reached"), _f(c.get("slo_held_up_to")), _f(c.get("max_concurrency_tested"))]
                         for c in f["capacity"]]))
    levels = f["load_levels"]
    if len(levels) > len({lv["variant"] for lv in levels}):
        parts.append("<h3>Per load level</h3>")
        parts.append(_table(["variant", "level", "n", "err", "KV peak %", "running max", "waiting max", "preempt",
                             "output tok/s", "goodput % [95% CI]", "slowdown p99", "meets SLOs"],
                            [[lv["variant"], lv["level"], lv["n"], lv["errors"],
                              _f(100 * lv["kv_peak"] if lv["kv_peak"] is not None else None, 1),
                              _f(lv["running_peak"]), _f(lv["waiting_peak"]), _f(lv["preemptions"]),
                              _f(lv["output_tps"], 1), f"{_f(lv['goodput_pct'], 0)} {_f(lv['goodput_ci95_pct'], 0)}",
                              ", ".join(f"{k} {x:.1f}x" for k, x in (lv["slowdown_p99"] or {}).items() if x) or "-",
                              {True: "yes", False: "no", None: "-"}[lv["meets_slo"]]] for lv in levels]))
    if f["quality_under_load"]:
        parts.append("<h3>Quality under load</h3><p class='note'>Each case at the highest level reached against its "
                     "own output at concurrency 1 (same variant, greedy decoding).</p>")
        parts.append(_table(["variant", "level vs 1", "pairs", "byte-identical %", "drift (1 − cos)", "grader deltas"],
                            [[e["variant"], e["level"], e["pairs"], _f(e["identical_pct"]), _f(e["drift_mean"], 3),
                              "; ".join(f"{m} {x['delta']:+.3g} {_f(x['ci95'], 2)}" for m, x in e["deltas"].items())]
                             for e in f["quality_under_load"]]))
    return parts


def render_html(ledger: Ledger, run_id: str | None = None, read: Read | None = None) -> str:
    """The HTML report; ``read``: the report, findings and rows when the caller has them (`full_report`)."""
    report, f, rows = read or full_report(ledger, run_id)
    rid = report["run"]["id"]
    run = report["run"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>evalkit run {escape(rid)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>evalkit — {escape(run['matrix_name'])}</h1>",
             f"<p class='note'>run {escape(rid)} · created {escape(run['created_at'])} · status {escape(run['status'])} "
             f"· baseline <b>{escape(str(report['baseline']))}</b> · dataset {escape(run['dataset_hash'][:12])}</p>",
             f"<p class='note'><b>{escape(host_line(report.get('host'), run.get('source')))}</b></p>"]
    if report.get("host_warning"):
        parts.append(f"<p class='note'><b>{escape(report['host_warning'])}</b></p>")
    parts.append(_table(["variant", "model", "engine", "dtype", "quantization", "status", "server ready (s)"],
                        [[v["name"], v["model"] or "", v["engine_version"] or v["engine"],
                          (v.get("dtype") or "-") + (f" ({v['dtype_reason']})" if v.get("dtype_reason") else ""),
                          v["quantization"] or "none", v["status"] + (f": {v['error']}" if v.get("error") else ""),
                          _f(v["ready_s"], 0)] for v in report["variants"]]))
    parts += _verdicts({**f, "multiplicity_notes": multiplicity_notes(f["multiplicity"])})
    parts.append("<h2>Summary (as in the study)</h2>")
    heads = headline_columns(report["graders"])
    cols = [*STUDY, *heads]
    parts.append(_table(["variant", *(m.label for m in cols)],
                        [[s["variant"] + (" (baseline)" if s["is_baseline"] else ""), *(cell(m, s) for m in cols)]
                         for s in f["study_summary"]]))
    parts.append("<h2>Plots</h2><div class='plots'>")
    parts += [f"<figure><figcaption class='note'>{escape(t)}</figcaption>{svg}</figure>"
              for t, svg in plots(ledger, rid, rows, f, report)]
    parts.append("</div>")
    for title, cols in (("Latency (ms)", latency_columns()), ("What the server did (ms)", server_columns()),
                        ("Quality", quality_columns(report["graders"]))):
        header, body = table_cells(report, cols)
        parts += [f"<h2>{escape(title)}</h2>", _table(header, body)]
    if report.get("grade_sample"):
        parts.append(f"<p class='note'>{escape(report['grade_sample'])}</p>")
    # the report's own notes (arrivals, the client's self-check, sweep levels, the floor passes) as
    # in the text report; its multiplicity lines are with the verdicts above
    shown = set(multiplicity_notes(f["multiplicity"]))
    parts += [f"<p class='note'>{escape(line)}</p>" for line in report.get("notes", []) if line not in shown]
    if not report["graders"]:
        parts.append("<p class='note'>No grades for this run yet (it ran with --no-grade): `evalkit grade` adds them.</p>")
    parts.append("<h2>Paired comparisons against the baseline (same case, same seed)</h2>"
                 "<p class='note'>Difference of the means in % (ratio of means, repeats averaged per case), with "
                 "the interval of its sign-flip test at the level of Holm's last step over every comparison of the "
                 "variant; a verdict only where that interval excludes 0.</p>")
    parts.append(_table(["variant", "slice", "metric", "pairs", "baseline mean", "Δ", "Δ %", "interval (%)", "level",
                         "Holm p", "verdict"],
                        [[p["variant"], p["complexity"], p["metric"], p["pairs"], _f(p["baseline_mean"], 1),
                          _f(p["delta"], 1), _f(p["delta_pct"], 1), _f(p.get("ci_pct"), 1),
                          f"{100 * p['ci_level']:.3g} %" if p.get("ci_level") else "-", _f(p.get("p_holm"), 3),
                          p["verdict"]] for p in f["paired"]]))
    parts += by_html(f, f.get("by"))  # `report --by ATTR`: latency and quality per value (reporting/by_attr.py)
    if f.get("flips"):  # pass/fail changes per case (reporting/flips.py)
        t = flips_table(f["flips"])
        parts += [f"<h2>Flips</h2><p class='note'>{escape(t.title)}</p>", _table(t.header, t.rows)]
    parts.append("<h2>Spikes (median + 3.5 × MAD per variant × complexity)</h2>")
    spikes = sorted(f["spikes"], key=lambda s: -s["robust_z"])
    if len(spikes) > SPIKES_LISTED:
        parts.append(f"<p class='note'>the {SPIKES_LISTED} largest of {len(spikes):,} (every one: the derived_spikes "
                     "table in `evalkit browse`); per slice and cause:</p>"
                     + "".join(f"<div class='spike'>{escape(line)}</div>" for line in count_lines(spikes)))
    parts.append("".join(f"<div class='spike'>{escape(s['line'])}</div>" for s in spikes[:SPIKES_LISTED]) or
                 "<p class='note'>no spikes</p>")
    parts += _capacity(f)
    if f["cost"]:
        parts.append("<h2>Cost per token</h2><p class='note'>The variant's price per hour over the throughput it "
                     "reached at each load level (the machine assumed busy at that level); ★ the highest level "
                     "that still meets the SLOs.</p>")
        parts.append(_table(["variant", "level", "meets SLOs", "output tok/s", "$/hour", "$ per M output tokens",
                             "$ per 1k requests", "reference $ per 1k requests", "break-even requests/hour"],
                            [[c["variant"] + (" ★" if c.get("best_level") else ""), c["level"],
                              {True: "yes", False: "no", None: "-"}[c["meets_slo"]], _f(c["output_tps"], 1),
                              _f(c["usd_per_hour"], 2), _f(c["usd_per_m_output_tokens"], 2),
                              _f(c["usd_per_1k_requests"], 3),
                              f"{_f(c.get('reference_usd_per_1k_requests'), 3)} ({c.get('reference') or '-'})",
                              _f(c.get("break_even_requests_per_hour"), 0)] for c in f["cost"]]))
    for line in f["notes"]:
        parts.append(f"<p class='note'>{escape(line)}</p>")
    parts.append("<h2>Sample outputs (verbatim, escaped)</h2>")
    for x in ledger.sample_outputs(rid):
        parts.append(f"<p class='note'>{escape(x['variant'])} · {escape(x['case_id'])}</p>"
                     f"<pre>{escape(x['text'] or x['error'] or '')}</pre>")
    parts.append(f"<p class='note'>definitions: docs/measuring.md · load: {escape(json.dumps(report['load']))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(ledger: Ledger, path: Path, run_id: str | None = None, read: Read | None = None) -> Path:
    html = render_html(ledger, run_id, read)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)  # never a half-written report
    return path
