"""`evalkit report`, `recommend` and `check`: what a run found, read from the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import LedgerWriteError, UsageError
from .common import LEDGER_OPT, RUN_OPT, EvalkitClickError, cli, command_ledger, ledger_path
from .console import print_report, say
from .grade import GRADER_PATH_OPT, use_graders


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--markdown", is_flag=True, help="print the report as Markdown (the default when output is not a terminal)")
@click.option("--slo", default=None, help="per-request goodput limits, e.g. ttft=2000,e2e=10000 [default: the run's]")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write one self-contained HTML report (plots inline, works offline)")
@click.option("--by", default=None,
              help="extra slices for the findings: complexity, level, concurrency, replica, or any case attribute "
                   "(comma-joined)")
@click.option("--spike-k", type=click.FloatRange(min=1), default=3.5, show_default=True,
              help="spike threshold: median + k x MAD per variant x complexity")
@click.option("--margins", default=None,
              help="non-inferiority margins, e.g. drift=0.05,schema_pass=-2pp,e2e_mean=+0% [default: the matrix's]")
@GRADER_PATH_OPT
def report(ledger: Path | None, run_id: str | None, as_json: bool, markdown: bool, slo: str | None,
           html_path: Path | None, by: str | None, spike_k: float, margins: str | None,
           grader_paths: tuple[Path, ...]) -> None:
    """Per variant and complexity: n, errors, TTFT p50/p90/p99/max, E2E mean/p50/p99, schema
    pass rate and the delta against the baseline in %; what the server did (queue, prefill,
    decode, KV-cache peak, preemptions, goodput); quality (persona, formality, drift vs its
    noise floor); paired comparisons with bootstrap intervals; spikes and their causes."""
    from ..execution.stops import parse_slo
    from ..reporting.findings import report_findings
    from ..reporting.report import to_json

    if as_json and markdown:
        raise UsageError("--json and --markdown are mutually exclusive")
    db = command_ledger(ledger_path(ledger), create=False)
    use_graders(db, run_id, grader_paths)  # the run's own graders, from any directory
    s = parse_slo(slo)
    args = {"slo": s.absolute_ms if s else None, "by": by.split(",") if by else None, "k": spike_k, "margins": margins}
    rep, fnd = report_findings(db, run_id, **args)  # ledger queries: no row read (issue 48)
    if html_path:
        from ..reporting.html import write_html

        write_html(db, html_path, rep["run"]["id"], (rep, fnd))  # its charts read a variant at a time
        # before the write below: the ledger's aggregates the findings asked stay valid for the charts (`_unchanged`)
        say(f"wrote {html_path}")
    if margins is None and spike_k == 3.5:  # the findings `browse` shows: kept, so it need not compute them again
        from ..sharing.browse import store_derived

        try:
            store_derived(db, rep["run"]["id"], fnd)
        except LedgerWriteError:
            pass  # a read-only ledger: browse computes them when it can
    if as_json:
        click.echo(to_json({**rep, "findings": fnd}))
    else:
        print_report(rep, fnd, by.split(",") if by else None, markdown_out=True if markdown else None)


TARGET_OPT = click.option("--target", default=None, help="percentile goals, e.g. ttft_p99=2000,e2e_p50=8000 (ms)")


@cli.command()
@LEDGER_OPT
@RUN_OPT
@TARGET_OPT
@click.option("--json", "as_json", is_flag=True)
def recommend(ledger: Path | None, run_id: str | None, target: str | None, as_json: bool) -> None:
    """Which variant meets the percentile goals per workload class (interactive long-input,
    interactive short/medium, batch), with a bootstrap interval on every percentile: a verdict
    that is within noise says 'borderline' instead of guessing."""
    from ..reporting.findings import parse_targets, recommend_lines
    from ..reporting.findings import recommend as rec

    if not target:
        raise UsageError("give --target, e.g. --target ttft_p99=2000,e2e_p50=8000")
    targets = parse_targets(target)
    db = command_ledger(ledger_path(ledger), create=False)
    rid = db.require_run(run_id)["id"]
    out = rec(db, rid, targets)
    click.echo(json.dumps(out, indent=2) if as_json else "\n".join(recommend_lines(out)))


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=VALUE",
              help="a grader's threshold (repeatable; `evalkit graders list` shows each one's names), e.g. "
                   "schema_pass=0.9, drift_above_floor=0, formality_mae=1")
@click.option("--max-error-rate", type=click.FloatRange(0, 1), default=None, help="maximum failed-request rate, 0-1")
@TARGET_OPT
@click.option("--margins", default=None,
              help="non-inferiority margins, e.g. drift=0.05,schema_pass=-2pp,e2e_mean=+0%: an inferior verdict fails")
@click.option("--max-client-lag", type=click.FloatRange(min=0), default=None,
              help="fail a variant whose client event-loop lag p99 over its requests is above this many ms")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the checks as JUnit XML")
@click.option("--require-decided", is_flag=True, default=False,
              help="fail a margin the run could not decide (inconclusive), not only an inferior one")
@GRADER_PATH_OPT
def check(ledger: Path | None, run_id: str | None, thresholds: tuple[str, ...], max_error_rate: float | None,
          target: str | None, margins: str | None, max_client_lag: float | None, junit_path: Path | None,
          require_decided: bool, grader_paths: tuple[Path, ...]) -> None:
    """Gate a run: exit 1 when any variant fails a threshold, a percentile goal or a margin, one
    line per failure (JUnit XML with --junit), so a model or engine upgrade can be gated in CI."""
    from ..reporting.gate import GateSpec, run_checks, summary_line, write_junit

    db = command_ledger(ledger_path(ledger), create=False)
    use_graders(db, run_id, grader_paths)  # a plugin's thresholds and margins, as a built-in's
    spec = GateSpec.from_options(list(thresholds), max_error_rate, target, margins, max_client_lag, require_decided)
    rid, checks = run_checks(db, run_id, spec)
    if junit_path:
        write_junit(junit_path, rid, checks)
    for c in checks:
        if not c.passed:
            click.echo(f"FAIL {c.variant}: {c.message}")
        elif not c.decided:
            click.echo(f"UNDECIDED {c.variant}: {c.message}")
    click.echo(f"check run {rid}: {summary_line(checks)}")
    if any(not c.passed for c in checks):
        raise EvalkitClickError(f"{sum(not c.passed for c in checks)} check(s) failed", 1)


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--from", "pilot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the ledger holding the pilot run [default: --ledger]")
@click.option("--detect", default=None, help="differences to detect, e.g. drift=0.05,e2e_mean=5 (%) [default: the "
                                               "size of each of the pilot matrix's margins]")
@click.option("--cases", type=click.IntRange(min=2), default=None, help="what this many cases can detect")
@click.option("--json", "as_json", is_flag=True)
@GRADER_PATH_OPT
def plan(ledger: Path | None, run_id: str | None, pilot: Path | None, detect: str | None, cases: int | None,
         as_json: bool, grader_paths: tuple[Path, ...]) -> None:
    """How many cases a question needs and how long they take here, from a pilot run's per-case
    spread (and, with several runs of the matrix, their between-run spread); or what a given
    number of cases can detect. Bare, it asks what the pilot's matrix margins ask: to detect a
    difference the size of each margin (else the embedded default matrix's)."""
    from ..reporting.plan import parse_detect, plan_lines
    from ..reporting.plan import plan as make_plan

    db = command_ledger(pilot or ledger_path(ledger), create=False)
    use_graders(db, run_id, grader_paths)
    p = make_plan(db, run_id, parse_detect(detect or ""), cases)
    click.echo(json.dumps(p, indent=2) if as_json else "\n".join(plan_lines(p)))


@cli.command()
@LEDGER_OPT
@click.argument("runs", nargs=-1)
@click.option("--metric", "metrics", multiple=True, help="a metric to pool (repeatable) [latency, drift, schema, "
                                                         "persona, formality]")
@click.option("--json", "as_json", is_flag=True)
def compare(ledger: Path | None, runs: tuple[str, ...], metrics: tuple[str, ...], as_json: bool) -> None:
    """Pool repeated runs of one matrix (default: every complete run of the latest run's matrix):
    per-run estimates, a pooled one with a between-run interval, and a warning when hosts,
    versions or dtypes differ."""
    from ..reporting.compare import compare as pool
    from ..reporting.compare import compare_lines

    db = command_ledger(ledger_path(ledger), create=False)
    c = pool(db, list(runs) or None, list(metrics) or None)
    click.echo(json.dumps(c, indent=2) if as_json else "\n".join(compare_lines(c)))
