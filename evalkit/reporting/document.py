"""The report as a document: the same blocks (lines of text and tables) in the same order for the
terminal, Markdown and whoever else renders it, verdicts first. A wide table is split into parts
that each fit a width, its key columns (variant, slice) repeated in every part."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..host import host_line
from .by_attr import by_table
from .report import latency_columns, quality_columns, server_columns, table_cells
from .spike_summary import count_lines
from .verdicts import level_text

SPIKES_SHOWN = 20  # the text report lists the largest; every one is in --json and derived_spikes


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    keys: int = 2  # leading columns repeated in every part of a split table
    groups: list[int] = field(default_factory=list)  # column -> group; a group is never split

    def widths(self) -> list[int]:
        return [max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.header)]


Block = str | Table


def split(t: Table, width: int) -> list[Table]:
    """Parts of a table that each fit ``width`` characters (about 3 per column for borders and
    padding), keeping the key columns in each and never splitting a group of columns."""
    w = [x + 3 for x in t.widths()]
    if sum(w) + 1 <= width or len(t.header) <= t.keys + 1:
        return [t]
    groups = t.groups or list(range(len(t.header)))
    runs: list[list[int]] = []
    for i in range(t.keys, len(t.header)):
        if runs and groups[i] == groups[runs[-1][-1]]:
            runs[-1].append(i)
        else:
            runs.append([i])
    base = sum(w[:t.keys]) + 1

    def pack(limit: float) -> list[list[int]]:
        parts: list[list[int]] = [[]]
        for run in runs:
            if parts[-1] and base + sum(w[i] for i in parts[-1] + run) > limit:
                parts.append([])
            parts[-1] += run
        return parts

    parts = pack(width)
    # as many parts as needed, but even: no part left with a single column
    target = base + sum(w[i] for r in runs for i in r) / len(parts)
    even = pack(min(width, target + max(w)))
    parts = even if len(even) == len(parts) else parts
    out = []
    for k, cols in enumerate(parts):
        idx = list(range(t.keys)) + cols
        out.append(Table(f"{t.title} ({k + 1}/{len(parts)})" if len(parts) > 1 else t.title,
                         [t.header[i] for i in idx], [[r[i] for i in idx] for r in t.rows], t.keys))
    return out


def markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            out += ["", f"**{b.title}**", "", "| " + " | ".join(b.header) + " |", "|" + "---|" * len(b.header)]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in b.rows]
            out.append("")
        else:
            out.append(b)
    return "\n".join(out).strip() + "\n"


def _report_table(report: dict[str, Any], columns: list, title: str, groups: list[int] | None = None) -> Table:
    header, body = table_cells(report, columns)
    return Table(title, header, body, 2, groups or [])


def _quality_groups(graders: list[str]) -> list[int]:
    """Column -> grader index, so a grader's columns stay together when the table is split."""
    from ..grading.registry import available

    out = [-1, -1]
    for k, (name, cls) in enumerate(available().items()):
        if name in graders:
            out += [k] * len(cls.aggregate.columns)
    return out


def verdict_blocks(fnd: dict[str, Any]) -> list[Block]:
    out: list[Block] = [f"verdict: {line}" for line in fnd.get("verdict_lines", [])]
    if not out and fnd.get("margins_given"):  # margins, but nothing to compare (a variant failed, no baseline)
        out.append(f"verdict: none: the margins ({', '.join(fnd['margins_given'])}) found no case both the baseline "
                   "and a candidate answered (see the variants' status below)")
    elif not out:
        out.append("verdict: none (no margins: give `margins:` in the matrix or --margins; docs/verdicts.md)")
    return out


def document(report: dict[str, Any], fnd: dict[str, Any] | None, by: list[str] | None = None) -> list[Block]:
    """Every block of `evalkit report`, verdicts first."""
    run = report["run"]
    blocks: list[Block] = [host_line(report.get("host"), run.get("source"))]
    if report.get("host_warning"):
        blocks.append(report["host_warning"])
    if fnd is not None:
        blocks += verdict_blocks(fnd)
    blocks.append(_report_table(report, latency_columns(), f"run {run['id']} — {run['matrix_name']} (baseline: "
                                                 f"{report['baseline']}), times in ms"))
    blocks.append(_report_table(report, server_columns(), "what the server did (vLLM /metrics or per-request "
                                                        "metrics), times in ms"
                                + (f"; goodput SLOs: {report['slo_ms']}" if report["slo_ms"] else "")))
    if report["graders"]:
        blocks.append(_report_table(report, quality_columns(report["graders"]),
                                    "quality: " + ", ".join(report["graders"]), _quality_groups(report["graders"])))
        if report.get("grade_sample"):
            blocks.append(report["grade_sample"])
    elif not run.get("source"):
        blocks.append("quality: no grades for this run yet (it ran with --no-grade): `evalkit grade` adds them")
    blocks += report.get("notes", [])
    for v in report["variants"]:
        if v.get("sent_again"):
            blocks.append(f"variant {v['name']}: {v['final']} requests, {v['attempts']} attempts "
                          f"({v['sent_again']} sent more than once)")
        if v["status"] != "complete":
            blocks.append(f"variant {v['name']}: {v['status']}: {v['error'] or ''}")
    if run.get("state") and run["state"] != run["status"]:
        blocks.append(f"run {run['id']}: {run['state']}")
    elif run["status"] != "complete":
        blocks.append(f"run {run['id']}: {run['status']}" + (f" ({run['stop_reason']})" if run.get("stop_reason")
                                                             else ""))
    if fnd is not None:
        blocks += findings_blocks(fnd, by)
    return blocks


def _ci(x: list[float] | None, d: str = "+.3g") -> str:
    return "-" if not x else f"[{x[0]:{d}}, {x[1]:{d}}]"


def findings_blocks(f: dict[str, Any], by: list[str] | None) -> list[Block]:
    out: list[Block] = []
    if f.get("verdicts"):
        out.append(Table("verdicts against the margins (candidate − baseline, paired by case; Holm within each variant)",
                         ["variant", "metric", "margin", "pairs", "estimate", "interval", "level", "verdict"],
                         [[e["variant"], e["metric"], e["margin_text"], str(e["pairs"]),
                           "-" if e["estimate"] is None else f"{e['estimate']:+.3g}", _ci(e["ci"]),
                           level_text(e["ci_level"]), e["verdict"]] for e in f["verdicts"]]))
    if f["paired"]:
        out.append(Table("paired comparisons vs the baseline (same cases): Δ of the means %, interval at the Holm level",
                         ["variant", "slice", "metric", "pairs", "Δ %", "interval %", "verdict"],
                         [[p["variant"], str(p["complexity"]), p["metric"], str(p["pairs"]),
                           "-" if p["delta_pct"] is None else f"{p['delta_pct']:+.1f}", _ci(p.get("ci_pct"), "+.1f"),
                           p["verdict"]] for p in f["paired"]]))
    if f.get("flips"):
        out.append(flips_table(f["flips"]))
    if by:
        def g(s: dict[str, Any], m: str, k: str) -> str:
            return "-" if s[m][k] is None else f"{s[m][k]:,.0f}"

        out.append(Table(f"slices by {', '.join(by)} (ms)",
                         ["variant", *by, "n", "err", "TTFT p50", "p95", "p99", "TPOT p50", "E2E mean", "std",
                          "tok/s p50"],
                         [[s["variant"], *(str(s[b]) for b in by), str(s["n"]), str(s["errors"]),
                           g(s, "ttft_ms", "p50"), g(s, "ttft_ms", "p95"), g(s, "ttft_ms", "p99"),
                           g(s, "tpot_ms", "p50"), g(s, "e2e_ms", "mean"), g(s, "e2e_ms", "std"),
                           g(s, "out_tps", "p50")] for s in f["slices"]], 1 + len(by)))
        if (q := by_table(f, by)) is not None:  # quality per attribute value (reporting/by_attr.py)
            out.append(Table(*q))
    out += f.get("notes", [])
    spikes = sorted(f["spikes"], key=lambda s: -s["robust_z"])
    out.append("spikes (median + k x MAD per variant x level x complexity)"
               + (f": the {SPIKES_SHOWN} largest of {len(spikes):,} (every one: the derived_spikes table in "
                  "`evalkit browse`)" if len(spikes) > SPIKES_SHOWN else "") + ":")
    out += [f"  {s['line']}" for s in spikes[:SPIKES_SHOWN] or [{"line": "none"}]]
    if len(spikes) > SPIKES_SHOWN:  # the rest counted per slice and cause
        out += ["spikes per slice and cause:", *(f"  {line}" for line in count_lines(spikes))]
    return out


def flips_table(table: list[dict[str, Any]]) -> Table:
    """Flips per candidate, pass/fail grader and persona rule (reporting/flips.py)."""
    return Table("flips: cases whose pass/fail changed vs the baseline (each case's first repeat; exact 95 % interval)",
                 ["variant", "grader", "rule", "cases", "lost", "gained", "flips %", "95% CI", "net pp",
                  "baseline vs itself %"],
                 [[e["variant"], e["grader"], e["rule"] or "(pass)", str(e["cases"]), str(e["losses"]), str(e["gains"]),
                   f"{e['flip_pct']:.0f}", _ci(e["ci95"], ".0f"), f"{e['net_pp']:+.0f}",
                   "-" if e["floor_flip_pct"] is None else f"{e['floor_flip_pct']:.0f}"] for e in table], 3)
