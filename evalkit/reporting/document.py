"""The report as a typed document: sections (a title and its blocks: lines of text and tables),
verdicts first, each built once (`@section`) and rendered by one loop in each of the terminal,
Markdown, HTML (reporting/html.py) and the dataset card (sharing/publish.py). A wide table is
split into parts that each fit a width, its key columns (variant, slice) repeated in every part."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..catalogue import fmt
from ..host import host_line
from ..spec.sizes import human
from .by_attr import by_table
from .report import latency_columns, quality_columns, server_columns, table_cells
from .spike_summary import count_lines, spike_set
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


def study_table(report: dict[str, Any], fnd: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The study's summary table, as every output shows it (the HTML and the dataset card): the
    study's columns and each grader's headline, less any column no variant has a value in (a
    workload without the shipped `complexity` has no short/medium/long TTFT tax)."""
    from ..catalogue import STUDY, cell
    from ..grading.registry import headline_columns

    rows = fnd.get("study_summary") or []
    cols = [m for m in (*STUDY, *headline_columns(report["graders"])) if any(s.get(m.key) is not None for s in rows)]
    return (["variant", *(m.label for m in cols)],
            [[s["variant"] + (" (baseline)" if s.get("is_baseline") else ""), *(cell(m, s) for m in cols)] for s in rows])


def verdict_blocks(fnd: dict[str, Any]) -> list[Block]:
    out: list[Block] = [f"verdict: {line}" for line in fnd.get("verdict_lines", [])]
    if not out and fnd.get("margins_given"):  # margins, but nothing to compare (a variant failed, no baseline)
        out.append(f"verdict: none: the margins ({', '.join(fnd['margins_given'])}) found no case both the baseline "
                   "and a candidate answered (see the variants' status below)")
    elif not out:
        out.append("verdict: none (no margins: give `margins:` in the matrix or --margins; docs/verdicts.md)")
    return out + list((fnd.get("timeshare") or {}).get("headline") or [])


@dataclass
class Section:
    """One part of the report: a title and its blocks. The terminal and `--markdown` print the
    blocks in order; the HTML report and the dataset card give each section its heading."""

    key: str
    title: str
    blocks: list[Block]


Report = dict[str, Any]
Findings = dict[str, Any] | None
SectionFn = Callable[[Report, Findings, "list[str] | None"], "Section | None"]
SECTIONS: list[SectionFn] = []  # the report's sections in order; every renderer loops over these


def section(fn: SectionFn) -> SectionFn:
    """Register a section builder: it then appears in the terminal, Markdown, HTML and card."""
    SECTIONS.append(fn)
    return fn


def sections(report: Report, fnd: Findings, by: list[str] | None = None) -> list[Section]:
    out = []
    for fn in SECTIONS:
        s = fn(report, fnd, by)
        if s is not None and s.blocks:
            out.append(s)
    return out


def document(report: Report, fnd: Findings, by: list[str] | None = None) -> list[Block]:
    """Every block of `evalkit report`, verdicts first: the sections' blocks in order."""
    return [b for s in sections(report, fnd, by) for b in s.blocks]


@section
def _run(report: Report, fnd: Findings, by: list[str] | None) -> Section:
    blocks: list[Block] = [host_line(report.get("host"), report["run"].get("source"))]
    if report.get("host_warning"):
        blocks.append(report["host_warning"])
    return Section("run", "Run", blocks)


@section
def _verdicts(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    if fnd is None:
        return None
    blocks = verdict_blocks(fnd)
    if fnd.get("verdicts"):
        blocks.append(Table("verdicts against the margins (candidate − baseline, paired by case; Holm within each "
                            "variant)",
                            ["variant", "metric", "margin", "pairs", "estimate", "interval", "level", "verdict"],
                            [[e["variant"], e["metric"], e["margin_text"],
                              f"{e['pairs']}{' blocks' if e.get('paired_by') == 'block' else ''}",
                              "-" if e["estimate"] is None else f"{e['estimate']:+.3g}", _ci(e["ci"]),
                              level_text(e["ci_level"]), e["verdict"]] for e in fnd["verdicts"]]))
    return Section("verdicts", "Verdicts", blocks)


@section
def _latency(report: Report, fnd: Findings, by: list[str] | None) -> Section:
    run = report["run"]
    return Section("latency", "Latency (ms)", [_report_table(
        report, latency_columns(), f"run {run['id']} — {run['matrix_name']} (baseline: {report['baseline']}), times in ms")])


@section
def _server(report: Report, fnd: Findings, by: list[str] | None) -> Section:
    return Section("server", "What the server did (ms)", [_report_table(
        report, server_columns(), "what the server did (vLLM /metrics or per-request metrics), times in ms"
        + (f"; goodput SLOs: {report['slo_ms']}" if report["slo_ms"] else ""))])


@section
def _quality(report: Report, fnd: Findings, by: list[str] | None) -> Section:
    blocks: list[Block] = []
    if report["graders"]:
        blocks.append(_report_table(report, quality_columns(report["graders"]),
                                    "quality: " + ", ".join(report["graders"]), _quality_groups(report["graders"])))
        if report.get("grade_sample"):
            blocks.append(report["grade_sample"])
    elif not report["run"].get("source"):
        blocks.append("quality: no grades for this run yet (it ran with --no-grade): `evalkit grade` adds them")
    return Section("quality", "Quality", blocks)


@section
def _report_notes(report: Report, fnd: Findings, by: list[str] | None) -> Section:
    run = report["run"]
    blocks: list[Block] = list(report.get("notes", []))
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
    return Section("notes", "Notes", blocks)


@section
def _paired(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    if not fnd or not fnd.get("paired"):
        return None
    return Section("paired", "Paired comparisons against the baseline", [Table(
        "paired comparisons vs the baseline (same cases): Δ of the means %, interval at the Holm level",
        ["variant", "slice", "metric", "pairs", "Δ %", "interval %", "verdict"],
        [[p["variant"], str(p["complexity"]), p["metric"], str(p["pairs"]),
          "-" if p["delta_pct"] is None else f"{p['delta_pct']:+.1f}", _ci(p.get("ci_pct"), "+.1f"),
          p["verdict"]] for p in fnd["paired"]])])


@section
def _flips(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    if not fnd or not fnd.get("flips"):
        return None
    return Section("flips", "Flips", [flips_table(fnd["flips"])])


@section
def _by(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    if not fnd or not by:
        return None

    def g(s: dict[str, Any], m: str, k: str) -> str:
        return "-" if s[m][k] is None else f"{s[m][k]:,.0f}"

    blocks: list[Block] = [Table(f"slices by {', '.join(by)} (ms)",
                                 ["variant", *by, "n", "err", "TTFT p50", "p95", "p99", "TPOT p50", "E2E mean", "std",
                                  "tok/s p50"],
                                 [[s["variant"], *(str(s[b]) for b in by), str(s["n"]), str(s["errors"]),
                                   g(s, "ttft_ms", "p50"), g(s, "ttft_ms", "p95"), g(s, "ttft_ms", "p99"),
                                   g(s, "tpot_ms", "p50"), g(s, "e2e_ms", "mean"), g(s, "e2e_ms", "std"),
                                   g(s, "out_tps", "p50")] for s in fnd.get("slices", [])], 1 + len(by))]
    if (q := by_table(fnd, by)) is not None:  # quality per attribute value (reporting/by_attr.py)
        blocks.append(Table(*q))
    return Section("by", f"By {', '.join(by)}", blocks)


@section
def _findings_notes(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    return Section("findings", "Findings", list(fnd.get("notes", []))) if fnd else None


@section
def _spikes(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    return Section("spikes", "Spikes", spike_blocks(fnd)) if fnd is not None else None


@section
def _capacity(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    return Section("capacity", "Capacity", capacity_blocks(fnd)) if fnd else None


@section
def _cost(report: Report, fnd: Findings, by: list[str] | None) -> Section | None:
    return Section("cost", "Cost per token", cost_blocks(fnd)) if fnd else None


def _ci(x: list[float] | None, d: str = "+.3g") -> str:
    return "-" if not x else f"[{x[0]:{d}}, {x[1]:{d}}]"


def spike_blocks(f: dict[str, Any]) -> list[Block]:
    out: list[Block] = []
    spikes = spike_set(f.get("spikes"))
    n = len(spikes)
    out.append("spikes (median + k x MAD per variant x level x complexity)"
               + (f": the {SPIKES_SHOWN} largest of {n:,} (every one: the derived_spikes table in "
                  "`evalkit browse`)" if n > SPIKES_SHOWN else "") + ":")
    out += [f"  {s['line']}" for s in spikes.largest(SPIKES_SHOWN) or [{"line": "none"}]]
    if n > SPIKES_SHOWN:  # the rest counted per slice and cause
        out += ["spikes per slice and cause:", *(f"  {line}" for line in count_lines(spikes))]
    return out


def findings_blocks(f: dict[str, Any], by: list[str] | None) -> list[Block]:
    """The findings' part of the document (paired tests, flips, slices, notes, spikes), as blocks."""
    out: list[Block] = []
    for fn in (_paired, _flips, _by, _findings_notes, _spikes):
        s = fn({}, f, by)
        out += s.blocks if s is not None else []
    return out


def flips_table(table: list[dict[str, Any]]) -> Table:
    """Flips per candidate, pass/fail grader and persona rule (reporting/flips.py)."""
    return Table("flips: cases whose pass/fail changed vs the baseline (each case's first repeat; exact 95 % interval)",
                 ["variant", "grader", "rule", "cases", "lost", "gained", "flips %", "95% CI", "net pp",
                  "baseline vs itself %"],
                 [[e["variant"], e["grader"], e["rule"] or "(pass)", str(e["cases"]), str(e["losses"]), str(e["gains"]),
                   f"{e['flip_pct']:.0f}", _ci(e["ci95"], ".0f"), f"{e['net_pp']:+.0f}",
                   "-" if e["floor_flip_pct"] is None else f"{e['floor_flip_pct']:.0f}"] for e in table], 3)


def _fmt(v: Any, d: int = 0) -> str:
    return fmt(None, v, d)


def _cells(rows: list[list[Any]]) -> list[list[str]]:
    return [[str(c) for c in r] for r in rows]


def _yes(x: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[x]


def capacity_blocks(f: dict[str, Any]) -> list[Block]:
    """What one memory budget holds per variant, how far each went before it saturated, per load
    level what the server did, and quality at the highest level against concurrency 1."""
    out: list[Block] = list(f.get("capacity_statement") or [])
    if f.get("capacity"):
        out.append(Table("capacity per variant (one memory budget)",
                         ["variant", "memory budget", "weights", "KV cache", "KV blocks × size", "KV tokens",
                          "predicted max concurrency", "max concurrent (short/medium/long)", "saturated at (why)",
                          "SLO held up to", "max tested"],
                         _cells([[c["variant"], human(c.get("memory_budget_bytes")) if c.get("memory_budget_bytes") else "-",
                           human(c.get("weight_bytes")), human(c.get("kv_bytes")),
                           f"{_fmt(c.get('blocks'))} × {_fmt(c.get('block_size'))}", _fmt(c.get("kv_tokens")),
                           _fmt(c.get("max_concurrency_predicted")),
                           "/".join(str(c.get("max_concurrent_by_complexity", {}).get(x, "-"))
                                    for x in ("short", "medium", "long")),
                           (f"{c['saturated_at']} ({c.get('saturation_reason') or '-'})" if c.get("saturated_at")
                            else "not reached"), _fmt(c.get("slo_held_up_to")), _fmt(c.get("max_concurrency_tested"))]
                          for c in f["capacity"]]), 1))
    levels = f.get("load_levels") or []
    if len(levels) > len({lv["variant"] for lv in levels}):
        out.append(Table("Per load level",
                         ["variant", "level", "n", "err", "KV peak %", "running max", "waiting max", "preempt",
                          "output tok/s", "goodput % [95% CI]", "slowdown p99", "meets SLOs"],
                         _cells([[lv["variant"], lv["level"], str(lv["n"]), str(lv["errors"]),
                           _fmt(100 * lv["kv_peak"] if lv["kv_peak"] is not None else None, 1),
                           _fmt(lv["running_peak"]), _fmt(lv["waiting_peak"]), _fmt(lv["preemptions"]),
                           _fmt(lv["output_tps"], 1), f"{_fmt(lv['goodput_pct'], 0)} {_fmt(lv['goodput_ci95_pct'], 0)}",
                           ", ".join(f"{k} {x:.1f}x" for k, x in (lv["slowdown_p99"] or {}).items() if x) or "-",
                           _yes(lv["meets_slo"])] for lv in levels])))
    if f.get("quality_under_load"):
        out.append(Table("Quality under load: each case at the highest level reached against its own output at "
                         "concurrency 1 (same variant, greedy decoding)",
                         ["variant", "level vs 1", "pairs", "byte-identical %", "drift (1 − cos)", "grader deltas"],
                         _cells([[e["variant"], e["level"], str(e["pairs"]), _fmt(e["identical_pct"]), _fmt(e["drift_mean"], 3),
                           "; ".join(f"{m} {x['delta']:+.3g} {_fmt(x['ci95'], 2)}" for m, x in e["deltas"].items())]
                          for e in f["quality_under_load"]]), 1))
    return out


def cost_blocks(f: dict[str, Any]) -> list[Block]:
    """The variant's price per hour over the throughput it reached at each load level."""
    if not f.get("cost"):
        return []
    return [Table("cost per token: the price per hour over the throughput at each level (the machine assumed busy "
                  "there); ★ the highest level that still meets the SLOs",
                  ["variant", "level", "meets SLOs", "output tok/s", "$/hour", "$ per M output tokens",
                   "$ per 1k requests", "reference $ per 1k requests", "break-even requests/hour"],
                  _cells([[c["variant"] + (" ★" if c.get("best_level") else ""), c["level"], _yes(c["meets_slo"]),
                    _fmt(c["output_tps"], 1), _fmt(c["usd_per_hour"], 2), _fmt(c["usd_per_m_output_tokens"], 2),
                    _fmt(c["usd_per_1k_requests"], 3),
                    f"{_fmt(c.get('reference_usd_per_1k_requests'), 3)} ({c.get('reference') or '-'})",
                    _fmt(c.get("break_even_requests_per_hour"), 0)] for c in f["cost"]]))]
