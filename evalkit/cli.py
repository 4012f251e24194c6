"""The evalkit command line: parse, call the library, print. No logic lives here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__
from .client import RequestResult
from .dataset import Case, load_cases, stratified_subset
from .errors import EvalkitError, UsageError
from .grading import GraderContext, grade_run, make_graders
from .host import host_line
from .ledger import Ledger, open_ledger
from .load import LoadSpec
from .matrix import load_matrix
from .paths import default_dataset_path, default_ledger_path
from .progress import ProgressLog
from .report import COLUMNS, SERVER_COLUMNS, build_report, markdown_table, quality_columns, table_cells, to_json
from .runner import resume_context
from .workflow import run_and_grade

err_console = Console(stderr=True)


class EvalkitClickError(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Group(click.Group):
    """Turns library errors into one-line click errors with the library's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EvalkitError as e:
            raise EvalkitClickError(str(e).splitlines()[0], e.exit_code) from None
        except click.UsageError as e:
            # one line, no usage banner: bad flags read like every other bad input
            if isinstance(e, click.NoSuchOption | click.BadParameter | click.MissingParameter | click.BadOptionUsage):
                raise EvalkitClickError(e.format_message().replace("\n", " "), 2) from None
            raise


LEDGER_OPT = click.option(
    "--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="SQLite ledger file [default: $EVALKIT_LEDGER or ./evalkit.db]",
)


def _ledger_path(p: Path | None) -> Path:
    return p or default_ledger_path()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="evalkit")
def cli() -> None:
    """evalkit: run the same real workload through several model variants served by vLLM,
    measure every request, grade every output, and keep it all in one SQLite ledger.

    \b
    Quick start (real vLLM on CPU, bundled SmolLM2, bf16 vs W8A8):
      evalkit run --limit 24      # serve each variant, send the cases, write evalkit.db
      evalkit report              # per variant x complexity: TTFT, E2E, schema pass, deltas
    """


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
            err_console.print(f"[dim]evalkit:[/dim] {text}")

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


def _print_report(report: dict[str, Any]) -> None:
    run = report["run"]
    click.echo(host_line(report.get("host")))
    if report.get("host_warning"):
        click.echo(report["host_warning"])
    # Not a terminal (a pipe, CI, a file): wide enough that no column is cut.
    console = Console(width=None if Console().is_terminal else 200)
    titles = [(COLUMNS, f"run {run['id']} — {run['matrix_name']} (baseline: {report['baseline']}), times in ms"),
              (SERVER_COLUMNS, "what the server did (vLLM /metrics), times in ms"
               + (f"; goodput SLOs: {report['slo_ms']}" if report["slo_ms"] else "")),
              (quality_columns(report["graders"]), "quality: "
               + ", ".join(report["graders"] or ["no grades yet"]) + " (drift: 1 − cosine vs the baseline's own noise floor)")]
    for columns, title in titles:
        header, body = table_cells(report, columns)
        t = Table(title=title)
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i < 2 else "right")
        for row in body:
            t.add_row(*row)
        console.print(t)
    for a in report.get("arrivals", []):
        click.echo(f"arrivals {a['variant']} {a['phase']}: {a['arrival']} at {a['requested_rps']:g}/s requested, "
                   f"{a['achieved_rps'] or 0:.2f}/s achieved over {a['n']} requests; send lag p50/p99/max "
                   f"{a['lag_p50_ms']:,.1f}/{a['lag_p99_ms']:,.1f}/{a['lag_max_ms']:,.1f} ms; "
                   f"max in flight {a['max_in_flight']}"
                   + (f" (cap {a['max_concurrency']})" if a["max_concurrency"] else " (uncapped)"))
        if a["warning"]:
            click.echo(f"warning: {a['variant']}: {a['warning']}")
    for v in report["variants"]:
        if v["status"] != "complete":
            click.echo(f"variant {v['name']}: {v['status']}: {v['error'] or ''}")


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=2000,tpot_ms=100,e2e_ms=10000` (the `_ms` may be left off)."""
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        key, eq, val = part.strip().partition("=")
        key = key.strip().removesuffix("_ms")
        if not eq or key not in ("ttft", "tpot", "e2e"):
            raise click.BadParameter(f"'{part}': expected ttft=MS, tpot=MS or e2e=MS", param_hint="--slo")
        try:
            out[key] = float(val)
        except ValueError:
            raise click.BadParameter(f"'{val}' is not a number of milliseconds", param_hint="--slo") from None
        if out[key] <= 0:
            raise click.BadParameter(f"'{part}': must be positive", param_hint="--slo")
    return out


def parse_sweep(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"'{text}': expected comma-separated integers, e.g. 1,2,4,8", param_hint="--sweep") from None
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter("levels must be positive integers", param_hint="--sweep")
    return levels




@cli.command()
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="matrix YAML [default: the embedded bf16 vs w8a8 matrix]")
@click.option("--dataset", "dataset_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="dataset JSONL [default: data/resume_gen_benchmark.jsonl]")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="run a stratified subset of N cases (balanced over complexity and task)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed for the subset, Poisson arrivals and interleaving order")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="send each case this many times per variant (sampling seed + repeat index)")
@click.option("--mode", type=click.Choice(["sequential", "concurrency", "rate"]), default=None,
              help="load pattern [default: sequential, or implied by --concurrency/--rate]")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="closed loop: this many requests in flight, the next sent when one finishes")
@click.option("--rate", type=float, default=None,
              help="open loop: arrivals at this many requests per second whatever the server does (seeded)")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default=None,
              help="with --rate: Poisson (exponential gaps, the default) or constant gaps")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="with --rate: cap on requests in flight; time held back is recorded as client_wait_ms")
@click.option("--sweep", default=None, help="concurrency levels, e.g. 1,2,4,8: stops at saturation")
@click.option("--stop-kv", type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="sweep saturation: peak KV-cache use at or above this fraction")
@click.option("--slo", default=None, help="goodput SLOs, e.g. ttft=2000,tpot=100,e2e=10000 (ms)")
@click.option("--interleave", is_flag=True,
              help="bring all variants up at once and alternate them per case (order randomised by --seed)")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="run each variant (or replica) as a Ray task: `--ray` alone starts a local Ray instance; "
                   "or give auto / ray://HOST:10001")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="complete the requests missing from an interrupted run (same matrix, cases, load)")
@LEDGER_OPT
@click.option("--no-grade", is_flag=True, help="skip grading after the run (use `evalkit grade` later)")
@click.option("--quiet", "-q", is_flag=True, help="no progress output")
def run(matrix_path: Path | None, dataset_path: Path | None, limit: int | None, seed: int, repeats: int,
        mode: str | None, concurrency: int | None, rate: float | None, arrival: str | None,
        max_concurrency: int | None, sweep: str | None, stop_kv: float, slo: str | None, interleave: bool,
        ray_address: str | None, resume_id: str | None, ledger: Path | None, no_grade: bool, quiet: bool) -> None:
    """Serve each variant of the matrix, send every case, record every request in the ledger.

    Launched variants get their own vLLM server (started, health-checked, stopped); endpoint
    variants are called as they are. Rows are written as requests finish, and each server's
    /metrics is scraped alongside so every request carries what the server did around it.
    """
    if resume_id:
        if matrix_path or dataset_path or limit or repeats != 1 or mode or concurrency or rate or sweep \
                or arrival or max_concurrency:
            raise UsageError("--resume takes the matrix, dataset, cases and load of the original run: "
                             "drop the other run options")
        db = open_ledger(_ledger_path(ledger), create=False)
        ctx = resume_context(db, resume_id)
        matrix, cases, dpath, load, repeats = ctx.matrix, ctx.cases, ctx.dataset_path, ctx.load, ctx.repeats
    else:
        load = LoadSpec.from_options(mode=mode, concurrency=concurrency, rate=rate, arrival=arrival,
                                     max_concurrency=max_concurrency, sweep=parse_sweep(sweep), stop_kv=stop_kv,
                                     slo=parse_slo(slo), interleave=interleave, seed=seed)
        matrix = load_matrix(matrix_path)
        dpath = dataset_path or default_dataset_path()
        cases = stratified_subset(load_cases(dpath), limit, seed)
        db = open_ledger(_ledger_path(ledger))
    reporter = RichReporter(quiet)
    summary, n, grade_s = run_and_grade(db, matrix, cases, dpath, repeats=repeats, seed=seed, load=load,
                               reporter=reporter, resume_run=resume_id, grade=not no_grade,
                               ray_address=ray_address)
    if not no_grade:
        reporter.message(f"graded {n} outputs in {grade_s:.1f} s")
    skipped = f", {summary.n_skipped} already in the ledger (skipped)" if resume_id else ""
    click.echo(f"run {summary.run_id}: {summary.n_requests} requests, {summary.n_errors} errors{skipped} "
               f"-> {_ledger_path(ledger)}")
    for name, why in summary.saturation.items():
        click.echo(f"{name}: {why}")
    if not quiet:
        _print_report(build_report(db, summary.run_id))
    if summary.failed_variants:
        names = ", ".join(f"{k} ({v})" for k, v in summary.failed_variants.items())
        raise EvalkitClickError(f"variant(s) failed: {names}", 1)


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--markdown", is_flag=True, help="print the tables as Markdown")
@click.option("--slo", default=None, help="goodput SLOs, e.g. ttft=2000,e2e=10000 [default: the run's]")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write one self-contained HTML report (plots inline, works offline)")
@click.option("--by", default=None,
              help="extra slices for the findings, any of complexity,persona,formality,task,candidate (comma-joined)")
@click.option("--spike-k", type=click.FloatRange(min=1), default=3.5, show_default=True,
              help="spike threshold: median + k x MAD per variant x complexity")
def report(ledger: Path | None, run_id: str | None, as_json: bool, markdown: bool, slo: str | None,
           html_path: Path | None, by: str | None, spike_k: float) -> None:
    """Per variant and complexity: n, errors, TTFT p50/p90/p99/max, E2E mean/p50/p99, schema
    pass rate and the delta against the baseline in %; what the server did (queue, prefill,
    decode, KV-cache peak, preemptions, goodput); quality (persona, formality, drift vs its
    noise floor); paired comparisons with bootstrap intervals; spikes and their causes."""
    from .findings import findings

    if as_json and markdown:
        raise UsageError("--json and --markdown are mutually exclusive")
    db = open_ledger(_ledger_path(ledger), create=False)
    rep = build_report(db, run_id, parse_slo(slo) or None)
    fnd = findings(db, rep["run"]["id"], by.split(",") if by else None, spike_k)
    if html_path:
        from .html_report import write_html

        write_html(db, html_path, rep["run"]["id"])
        err_console.print(f"[dim]evalkit:[/dim] wrote {html_path}")
    if as_json:
        click.echo(to_json({**rep, "findings": fnd}))
    elif markdown:
        click.echo(host_line(rep.get("host")) + "\n")
        click.echo("\n\n".join(markdown_table(rep, c) for c in (COLUMNS, SERVER_COLUMNS,
                                                               quality_columns(rep["graders"]))))
    else:
        _print_report(rep)
        _print_findings(fnd, by.split(",") if by else None)


def _print_findings(f: dict[str, Any], by: list[str] | None) -> None:
    console = Console(width=None if Console().is_terminal else 200)
    t = Table(title="paired comparisons vs the baseline (same case, same seed): mean Δ, 95% bootstrap CI")
    for h in ("variant", "slice", "metric", "pairs", "Δ %", "95% CI %", "verdict"):
        t.add_column(h)
    for p in f["paired"]:
        ci = p["ci95_pct"]
        t.add_row(p["variant"], str(p["complexity"]), p["metric"], str(p["pairs"]),
                  "-" if p["delta_pct"] is None else f"{p['delta_pct']:+.1f}",
                  "-" if not ci else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]", p["verdict"])
    if f["paired"]:
        console.print(t)
    if by:
        t = Table(title=f"slices by {', '.join(by)} (ms)")
        for h in ("variant", *by, "n", "err", "TTFT p50", "p95", "p99", "TPOT p50", "E2E mean", "std", "tok/s p50"):
            t.add_column(h)
        def g(s: dict[str, Any], m: str, k: str) -> str:
            return "-" if s[m][k] is None else f"{s[m][k]:,.0f}"

        for s in f["slices"]:
            t.add_row(s["variant"], *(str(s[b]) for b in by), str(s["n"]), str(s["errors"]),
                      g(s, "ttft_ms", "p50"), g(s, "ttft_ms", "p95"), g(s, "ttft_ms", "p99"), g(s, "tpot_ms", "p50"),
                      g(s, "e2e_ms", "mean"), g(s, "e2e_ms", "std"), g(s, "out_tps", "p50"))
        console.print(t)
    for d in f.get("formality_disagreements", []):
        click.echo(f"formality estimators disagree by ≥2 on request {d['request_id']} ({d['variant']}, {d['case_id']}): "
                   f"markers {d['markers']}, embeddings {d['embeddings']}, requested {d['requested']}")
    click.echo("spikes (median + k x MAD per variant x complexity):")
    for s in f["spikes"] or [{"line": "none"}]:
        click.echo(f"  {s['line']}")


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--slo", required=True, help="targets, e.g. ttft_p99=2000,e2e_p50=8000 (ms)")
@click.option("--json", "as_json", is_flag=True)
def recommend(ledger: Path | None, run_id: str | None, slo: str, as_json: bool) -> None:
    """Which variant meets the SLOs for each workload class (interactive long-input, interactive
    short/medium, batch), with a bootstrap interval on every percentile: a verdict that is within
    noise says 'borderline' instead of guessing."""
    from .findings import parse_slo_targets, request_rows
    from .findings import recommend as rec

    targets = parse_slo_targets(slo)
    db = open_ledger(_ledger_path(ledger), create=False)
    rid = db.require_run(run_id)["id"]
    out = rec(request_rows(db, rid), targets)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    for wl in dict.fromkeys(o["workload"] for o in out):
        rows = [o for o in out if o["workload"] == wl]
        good = [o["variant"] for o in rows if o["status"] == "meets"]
        click.echo(f"{wl}: " + (f"use {', '.join(good)}" if good else "no variant clearly meets the SLOs"))
        for o in rows:
            ev = "; ".join(
                f"{c['metric'].removesuffix('_ms')} p{c['q']:g} {c['estimate_ms'] or 0:,.0f} ms "
                f"[{(c['ci95_ms'] or [0, 0])[0]:,.0f}, {(c['ci95_ms'] or [0, 0])[1]:,.0f}] vs {c['limit_ms']:,.0f} "
                f"({c['status']})" for c in o["checks"])
            click.echo(f"  {o['variant']}: {o['status']} (n={o['n']}, errors={o['errors']}): {ev}")


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--max-drift-above-floor", type=float, default=None,
              help="fail a variant whose drift − noise floor is above this (its 95 % CI lies above it)")
@click.option("--min-schema", type=click.FloatRange(0, 1), default=None, help="minimum schema pass rate, 0-1")
@click.option("--max-formality-mae", type=click.FloatRange(min=0), default=None, help="maximum formality MAE")
@click.option("--max-error-rate", type=click.FloatRange(0, 1), default=None, help="maximum failed-request rate, 0-1")
@click.option("--slo", default=None, help="latency limits, e.g. ttft_p99=2000,e2e_p50=8000 (ms)")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the checks as JUnit XML")
def check(ledger: Path | None, run_id: str | None, max_drift_above_floor: float | None, min_schema: float | None,
          max_formality_mae: float | None, max_error_rate: float | None, slo: str | None,
          junit_path: Path | None) -> None:
    """Gate a run: exit 1 when any variant fails a threshold, one line per failure (JUnit XML
    with --junit), so a model or engine upgrade can be gated in CI."""
    from .findings import parse_slo_targets
    from .gate import Thresholds, junit_xml, run_checks, summary_line

    t = Thresholds(max_drift_above_floor, min_schema, max_formality_mae, max_error_rate,
                   parse_slo_targets(slo) if slo else None)
    db = open_ledger(_ledger_path(ledger), create=False)
    rid, checks = run_checks(db, run_id, t)
    if junit_path:
        tmp = junit_path.with_suffix(junit_path.suffix + ".tmp")
        tmp.write_text(junit_xml(rid, checks), encoding="utf-8")
        tmp.replace(junit_path)
    for c in checks:
        if not c.passed:
            click.echo(f"FAIL {c.variant}: {c.message}")
    click.echo(f"check run {rid}: {summary_line(checks)}")
    if any(not c.passed for c in checks):
        raise EvalkitClickError(f"{sum(not c.passed for c in checks)} check(s) failed", 1)


@cli.command()
@LEDGER_OPT
@click.option("--host", default="127.0.0.1", show_default=True, help="bind address (anything else exposes the ledger)")
@click.option("--port", type=click.IntRange(1, 65535), default=8001, show_default=True)
def browse(ledger: Path | None, host: str, port: int) -> None:
    """Datasette on the ledger with titles, column descriptions, facets, canned queries (seed
    summary, spikes, worst drift, schema failures) and readable generated text."""
    from .browse import browse as serve

    path = _ledger_path(ledger)
    db = open_ledger(path, create=False)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console.print(f"[yellow]evalkit: serving on {host}: anyone who can reach it can read the ledger[/yellow]")
    click.echo(f"Datasette on http://{host}:{port}/ (Ctrl-C stops it)")
    serve(db, path, host, port)


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--repo", default=None, help="OWNER/NAME of the Hugging Face dataset to push to")
@click.option("--private", is_flag=True, help="create the dataset repo as private")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write the parquet files and dataset card here instead of (or before) pushing")
def publish(ledger: Path | None, run_id: str | None, repo: str | None, private: bool, out_dir: Path | None) -> None:
    """Publish a run as a Hugging Face dataset: configs for requests, grades, server series,
    summary (parquet) and a dataset card with config, definitions and the summary table. The
    token comes from $HF_TOKEN only; anything that looks like a secret stops the publish."""
    import tempfile

    from .publish import export, push

    if not repo and not out_dir:
        raise UsageError("give --repo OWNER/NAME to push, or --out DIR to write the files locally")
    db = open_ledger(_ledger_path(ledger), create=False)
    target = out_dir or Path(tempfile.mkdtemp(prefix="evalkit-publish-")) / "dataset"
    counts = export(db, target, run_id)
    click.echo(f"wrote {target}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if repo:
        click.echo(f"pushed to {push(target, repo, private)}")


def _run_judge(db: Ledger, run_id: str) -> Any:
    """The run's judge settings, if its matrix had any (only that section is read back)."""
    from .matrix import Judge

    judge = json.loads(db.require_run(run_id)["matrix_json"] or "{}").get("judge")
    return Judge.model_validate(judge) if judge else None


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--grader", "graders", multiple=True,
              help="a registered grader (repeatable; `evalkit graders list`) [default: the default ones]")
def grade(ledger: Path | None, run_id: str | None, graders: tuple[str, ...]) -> None:
    """Grade a run's outputs again without regenerating; new grader versions add rows."""
    db = open_ledger(_ledger_path(ledger), create=False)
    rid = db.require_run(run_id)["id"]
    n = grade_run(db, rid, make_graders(list(graders) or None, GraderContext(judge=_run_judge(db, rid))))
    click.echo(f"run {rid}: {n} new grades")


@cli.group(cls=Group)
def graders() -> None:
    """Check the graders themselves."""


@graders.command("list")
def graders_list() -> None:
    """Every registered grader (built-in and plugins, entry point group `evalkit.graders`)."""
    from .grading import available

    for name, cls in available().items():
        cols = ", ".join(c.key for c in cls.summary_columns)
        click.echo(f"{name} v{cls.version} ({cls.kind}{', default' if cls.default else ''}): {cls.description} "
                   f"[{cols}]")


@graders.command("calibrate")
@click.option("--grader", type=click.Choice(["formality", "persona"]), default="formality", show_default=True)
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='labelled JSON lines [default: rubrics/formality_test.jsonl, the held-out test file; '
                   'persona: rubrics/persona_labels.jsonl]')
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def graders_calibrate(grader: str, path: Path | None, as_json: bool) -> None:
    """How well a grader agrees with labels. formality: both estimators (markers, embeddings) —
    n, exact, within ±1, MAE, Spearman rho, recall per level, confusion, their agreement.
    persona: per-rule precision and recall of the rule's failures, and accuracy."""
    if grader == "persona":
        from .grading.persona import calibrate_persona

        r = calibrate_persona(path)
        if as_json:
            click.echo(json.dumps(r, indent=2))
            return
        click.echo(f"{r['file']}: {r['n']} labelled outputs")
        for rule, x in r["rules"].items():
            p_, rc = x["fail_precision"], x["fail_recall"]
            click.echo(f"  {rule}: n={x['n']} accuracy={x['accuracy']:.1%} failures: labelled {x['labelled_fail']}, "
                       f"flagged {x['flagged_fail']}, precision {'-' if p_ is None else f'{p_:.1%}'}, "
                       f"recall {'-' if rc is None else f'{rc:.1%}'}")
        return
    from .grading.formality import calibrate

    r = calibrate(path)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(r["file"])
    for est in ("markers", "embeddings"):
        if est not in r:
            continue
        x = r[est]
        click.echo(f"  {est}: n={x['n']}  exact={x['exact_accuracy']:.1%}  within ±1={x['within_1_accuracy']:.1%}  "
                   f"MAE={x['mae']:.2f}  Spearman rho={x['spearman_rho']:.3f}  recall by level "
                   + " ".join("-" if v is None else f"{v:.0%}" for v in x["recall_by_level"]))
        click.echo("    confusion (rows: labelled 1-5, columns: predicted 1-5): "
                   + " | ".join(" ".join(f"{v:2d}" for v in row) for row in x["confusion"]))
    if "agreement" in r:
        click.echo(f"  the two estimators agree on {r['agreement']:.1%}; {r['disagree_by_2']} disagree by 2 or more")


@cli.group(cls=Group)
def rubrics() -> None:
    """Check rubric and schema files."""


@rubrics.command("validate")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="rubrics directory [default: rubrics/]")
def rubrics_validate(directory: Path | None) -> None:
    """Load every rubric (persona, formality) and JSON Schema, reporting the first error."""
    from .grading.formality import FormalityRubric, load_yaml_model
    from .grading.persona import PersonaRubric
    from .output_schemas import known_schema_names, load_schema
    from .paths import rubrics_dir

    d = directory or rubrics_dir()
    p = load_yaml_model(d / "persona.yaml", PersonaRubric)
    f = load_yaml_model(d / "formality.yaml", FormalityRubric)
    names = sorted(known_schema_names(d / "schemas"))
    for n in names:
        load_schema(n, d / "schemas")
    click.echo(f"{d}: OK — persona rules: {', '.join(p.rules)}; formality features: {len(f.weights)}; "
               f"schemas: {', '.join(names)}")


@cli.group(cls=Group)
def dataset() -> None:
    """Inspect and check benchmark datasets."""


@dataset.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
def dataset_validate(path: Path | None) -> None:
    """Check every row of a dataset (default: the shipped benchmark)."""
    cases = load_cases(path)
    by: dict[str, int] = {}
    for c in cases:
        by[c.complexity] = by.get(c.complexity, 0) + 1
    parts = ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
    click.echo(f"{path or default_dataset_path()}: {len(cases)} cases OK ({parts})")


@cli.group(cls=Group)
def matrix() -> None:
    """Inspect and check matrix files."""


@matrix.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
def matrix_validate(path: Path | None) -> None:
    """Check a matrix file (default: the embedded default matrix)."""
    m = load_matrix(path)
    names = ", ".join(v.name + (" (baseline)" if v.name == m.baseline else "") for v in m.variants)
    click.echo(f"{path or 'default matrix'}: OK — {m.name}: {names}")


@cli.group(cls=Group)
def ledger() -> None:
    """Where the ledger is; merging ledgers."""


@ledger.command("merge")
@click.argument("sources", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the merged ledger to write (must not exist)")
def ledger_merge(sources: tuple[Path, ...], out: Path) -> None:
    """Merge ledgers made apart: migrations aligned, run ids kept, a run resumed in two places
    de-duplicated by (variant, case, repeat, phase)."""
    from .ledger.merge import merge_ledgers

    counts = merge_ledgers(list(sources), out)
    click.echo(f"wrote {out}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()))


@ledger.command("path")
@LEDGER_OPT
def ledger_path(ledger: Path | None) -> None:
    """Print the ledger path (for `datasette "$(evalkit ledger path)"`)."""
    click.echo(str(_ledger_path(ledger).resolve()))


@cli.command()
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def prepare(matrix_path: Path | None) -> None:
    """Prepare the bundled models a matrix uses (done automatically by `run` on first use)."""
    from .engines.bundled import is_bundled, resolve_model

    m = load_matrix(matrix_path)
    for v in m.variants:
        if v.model and is_bundled(v.model):
            click.echo(f"{v.name}: {resolve_model(v.model, say=lambda s: err_console.print(s))}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
