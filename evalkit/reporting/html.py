"""One self-contained HTML file (inline SVG, no scripts, no CDN) with the findings and plots.
Generated text is untrusted: every string from the ledger is HTML-escaped."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from ..catalogue import fmt
from ..ledger import Ledger
from .document import Block, Table, sections, study_table
from .findings import report_findings
from .plots import plots

# the report and its findings (`findings.report_findings`), when the caller has them
Read = tuple[dict[str, Any], dict[str, Any]]

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


def _blocks(blocks: list[Block]) -> list[str]:
    """A section's blocks as HTML: a table under its title, a verdict line in bold, other lines as notes."""
    out = []
    for blk in blocks:
        if isinstance(blk, Table):
            out += [f"<p class='note'>{escape(blk.title)}</p>", _table(blk.header, blk.rows)]
        elif blk.startswith("verdict:"):
            out.append(f"<p><b>{escape(blk)}</b></p>")
        elif blk.startswith("  "):
            out.append(f"<div class='spike'>{escape(blk.strip())}</div>")
        else:
            out.append(f"<p class='note'>{escape(blk)}</p>")
    return out


def render_html(ledger: Ledger, run_id: str | None = None, read: Read | None = None) -> str:
    """The HTML report; ``read``: the report and findings when the caller has them (else
    `report_findings`); the charts read the rows a variant at a time (`plots.plots`).
    Its sections are the terminal's (`document.sections`), each under its heading, with the variants,
    the study's summary, the plots and sample outputs around them."""
    report, f = read or report_findings(ledger, run_id)
    rid = report["run"]["id"]
    run = report["run"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>evalkit run {escape(rid)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>evalkit — {escape(run['matrix_name'])}</h1>",
             f"<p class='note'>run {escape(rid)} · created {escape(run['created_at'])} · status {escape(run['status'])} "
             f"· baseline <b>{escape(str(report['baseline']))}</b> · dataset {escape(run['dataset_hash'][:12])}</p>"]
    parts.append(_table(["variant", "model", "engine", "dtype", "quantization", "status", "server ready (s)"],
                        [[v["name"], v["model"] or "", v["engine_version"] or v["engine"],
                          (v.get("dtype") or "-") + (f" ({v['dtype_reason']})" if v.get("dtype_reason") else ""),
                          v["quantization"] or "none", v["status"] + (f": {v['error']}" if v.get("error") else ""),
                          _f(v["ready_s"], 0)] for v in report["variants"]]))
    parts.append("<h2>Summary (as in the study)</h2>")
    parts.append(_table(*study_table(report, f)))
    parts.append("<h2>Plots</h2><div class='plots'>")
    parts += [f"<figure><figcaption class='note'>{escape(t)}</figcaption>{svg}</figure>"
              for t, svg in plots(ledger, rid, f, report)]
    parts.append("</div>")
    for sec in sections(report, f, f.get("by")):
        parts.append(f"<h2>{escape(sec.title)}</h2>")
        parts += _blocks(sec.blocks)
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
