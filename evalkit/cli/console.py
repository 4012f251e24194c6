"""Presentation on a terminal or a log: the progress reporter and the report's tables."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..execution.progress import ProgressLog
from ..host import host_line
from ..measure.client import RequestResult
from ..reporting.report import COLUMNS, SERVER_COLUMNS, quality_columns, table_cells
from ..spec.dataset import Case

err_console = Console(stderr=True)


def console() -> Console:
    # Not a terminal (a pipe, CI, a file): wide enough that no column is cut.
    return Console(width=None if Console().is_terminal else 200)


def say(text: str) -> None:
    err_console.print(f"[dim]evalkit:[/dim] {text}", highlight=False)


class RichReporter:
    """A rich progress bar on a terminal; plain progress lines when output goes to a log."""

    def __init__(self, quiet: bool = False, interval_s: float = 15.0) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task: Any = None
        self.plain = not err_console.is_terminal
        self.interval_s = interval_s
        self.logs: dict[str, ProgressLog] = {}

    def message(self, text: str) -> None:
        if not self.quiet:
            say(text)

    def variant_start(self, variant: str, total: int) -> None:
        if self.quiet:
            return
        if self.plain:
            self.logs[variant.split(" ")[0]] = ProgressLog(variant, total, self.interval_s)
            return
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=err_console,
        )
        self.progress.start()
        self.task = self.progress.add_task(variant, total=total, errors=0)

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        log = self.logs.get(variant)
        if log is not None and not case.id.startswith("_warmup"):
            line = log.add(result)
            if line:
                click.echo(f"evalkit: {line}", err=True)
        if self.progress is not None:
            errors = self.progress.tasks[0].fields["errors"] + (0 if result.ok else 1)
            self.progress.update(self.task, advance=1, errors=errors)

    def variant_end(self, variant: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def table(title: str, header: list[str], body: list[list[str]]) -> Table:
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < 2 else "right")
    for row in body:
        t.add_row(*row)
    return t


def print_report(report: dict[str, Any]) -> None:
    run = report["run"]
    click.echo(host_line(report.get("host"), run.get("source")))
    if report.get("host_warning"):
        click.echo(report["host_warning"])
    c = console()
    titles = [(COLUMNS, f"run {run['id']} — {run['matrix_name']} (baseline: {report['baseline']}), times in ms"),
              (SERVER_COLUMNS, "what the server did (vLLM /metrics or per-request metrics), times in ms"
               + (f"; goodput SLOs: {report['slo_ms']}" if report["slo_ms"] else ""))]
    if report["graders"]:
        titles.append((quality_columns(report["graders"]), "quality: " + ", ".join(report["graders"])
                       + " (drift: 1 − cosine vs the baseline's own noise floor)"))
    for columns, title in titles:
        header, body = table_cells(report, columns)
        c.print(table(title, header, body))
    if not report["graders"] and not run.get("source"):
        click.echo("quality: no grades for this run yet (it ran with --no-grade): `evalkit grade` adds them")
    for line in report.get("notes", []):
        click.echo(line)
    for v in report["variants"]:
        if v.get("sent_again"):
            click.echo(f"variant {v['name']}: {v['final']} requests, {v['attempts']} attempts "
                       f"({v['sent_again']} sent more than once)")
        if v["status"] != "complete":
            click.echo(f"variant {v['name']}: {v['status']}: {v['error'] or ''}")
    if run.get("state") and run["state"] != run["status"]:
        click.echo(f"run {run['id']}: {run['state']}")
    elif run["status"] != "complete":
        click.echo(f"run {run['id']}: {run['status']}" + (f" ({run['stop_reason']})" if run.get("stop_reason") else ""))


def print_findings(f: dict[str, Any], by: list[str] | None) -> None:
    c = console()
    for line in f.get("verdict_lines", []):
        click.echo(f"verdict: {line}")
    if f.get("verdicts"):
        c.print(table("verdicts against the margins (candidate − baseline, paired by case; Holm within each variant)",
                      ["variant", "metric", "margin", "pairs", "estimate", "95% CI", "Holm p", "verdict"],
                      [[e["variant"], e["metric"], e["margin_text"], str(e["pairs"]),
                        "-" if e["estimate"] is None else f"{e['estimate']:+.3g}",
                        "-" if not e["ci95"] else f"[{e['ci95'][0]:+.3g}, {e['ci95'][1]:+.3g}]",
                        "-" if e["p_holm"] is None else f"{e['p_holm']:.3f}", e["verdict"]] for e in f["verdicts"]]))
    if f["paired"]:
        c.print(table("paired comparisons vs the baseline (same case, same seed): mean Δ, 95% bootstrap CI",
                      ["variant", "slice", "metric", "pairs", "Δ %", "95% CI %", "verdict"],
                      [[p["variant"], str(p["complexity"]), p["metric"], str(p["pairs"]),
                        "-" if p["delta_pct"] is None else f"{p['delta_pct']:+.1f}",
                        "-" if not p["ci95_pct"] else f"[{p['ci95_pct'][0]:+.1f}, {p['ci95_pct'][1]:+.1f}]",
                        p["verdict"]] for p in f["paired"]]))
    if by:
        def g(s: dict[str, Any], m: str, k: str) -> str:
            return "-" if s[m][k] is None else f"{s[m][k]:,.0f}"

        c.print(table(f"slices by {', '.join(by)} (ms)",
                      ["variant", *by, "n", "err", "TTFT p50", "p95", "p99", "TPOT p50", "E2E mean", "std", "tok/s p50"],
                      [[s["variant"], *(str(s[b]) for b in by), str(s["n"]), str(s["errors"]),
                        g(s, "ttft_ms", "p50"), g(s, "ttft_ms", "p95"), g(s, "ttft_ms", "p99"), g(s, "tpot_ms", "p50"),
                        g(s, "e2e_ms", "mean"), g(s, "e2e_ms", "std"), g(s, "out_tps", "p50")] for s in f["slices"]]))
    for line in f.get("notes", []):
        click.echo(line)
    click.echo("spikes (median + k x MAD per variant x complexity):")
    for s in f["spikes"] or [{"line": "none"}]:
        click.echo(f"  {s['line']}")
