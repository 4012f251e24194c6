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
from .grading import grade_run, make_graders
from .ledger import open_ledger
from .matrix import load_matrix
from .paths import default_dataset_path, default_ledger_path
from .report import (
    COLUMNS,
    QUALITY_COLUMNS,
    SERVER_COLUMNS,
    build_report,
    latest_run_id,
    markdown_table,
    table_cells,
    to_json,
)
from .runner import LoadSpec, resume_context, run_matrix

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
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task: Any = None

    def message(self, text: str) -> None:
        if not self.quiet:
            err_console.print(f"[dim]evalkit:[/dim] {text}")

    def variant_start(self, variant: str, total: int) -> None:
        if self.quiet:
            return
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=err_console,
        )
        self.progress.start()
        self.task = self.progress.add_task(variant, total=total, errors=0)

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        if self.progress is not None:
            errors = self.progress.tasks[0].fields["errors"] + (0 if result.ok else 1)
            self.progress.update(self.task, advance=1, errors=errors)

    def variant_end(self, variant: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _print_report(report: dict[str, Any]) -> None:
    run = report["run"]
    # Not a terminal (a pipe, CI, a file): wide enough that no column is cut.
    console = Console(width=None if Console().is_terminal else 200)
    titles = [(COLUMNS, f"run {run['id']} — {run['matrix_name']} (baseline: {report['baseline']}), times in ms"),
              (SERVER_COLUMNS, "what the server did (vLLM /metrics), times in ms"
               + (f"; goodput SLOs: {report['slo_ms']}" if report["slo_ms"] else "")),
              (QUALITY_COLUMNS, "quality: persona rubric, formality vs requested level, drift (1 − cosine) "
               "vs the baseline's own noise floor")]
    for columns, title in titles:
        header, body = table_cells(report, columns)
        t = Table(title=title)
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i < 2 else "right")
        for row in body:
            t.add_row(*row)
        console.print(t)
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


def build_load(mode: str | None, concurrency: int | None, rate: float | None, sweep: str | None,
               stop_kv: float, slo: str | None, interleave: bool, seed: int) -> LoadSpec:
    """Turn the flags into one LoadSpec, refusing combinations that contradict each other."""
    if rate is not None and rate <= 0:
        raise click.BadParameter("must be a positive number of requests per second", param_hint="--rate")
    inferred = "rate" if rate is not None else "concurrency" if (concurrency or 1) > 1 else "sequential"
    if mode and mode != inferred and not (mode == "concurrency" and concurrency is None):
        raise UsageError(f"--mode {mode} conflicts with "
                         + (f"--rate {rate:g}" if rate is not None else f"--concurrency {concurrency}"))
    levels = parse_sweep(sweep)
    if levels and (rate is not None or concurrency):
        raise UsageError("--sweep sets the concurrency levels itself: drop --rate/--concurrency")
    if interleave and (levels or rate is not None or (concurrency or 1) > 1):
        raise UsageError("--interleave alternates variants one request at a time: use it with sequential mode")
    s = parse_slo(slo)
    return LoadSpec(mode=mode or inferred, concurrency=concurrency or 1, rate=rate, sweep=levels, stop_kv=stop_kv,
                    slo_ttft_ms=s.get("ttft"), slo_tpot_ms=s.get("tpot"), slo_e2e_ms=s.get("e2e"),
                    interleave=interleave, seed=seed)


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
@click.option("--concurrency", type=click.IntRange(min=1), default=None, help="requests in flight at once")
@click.option("--rate", type=float, default=None, help="requests per second, Poisson arrivals (seeded)")
@click.option("--sweep", default=None, help="concurrency levels, e.g. 1,2,4,8: stops at saturation")
@click.option("--stop-kv", type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="sweep saturation: peak KV-cache use at or above this fraction")
@click.option("--slo", default=None, help="goodput SLOs, e.g. ttft=2000,tpot=100,e2e=10000 (ms)")
@click.option("--interleave", is_flag=True,
              help="bring all variants up at once and alternate them per case (order randomised by --seed)")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="complete the requests missing from an interrupted run (same matrix, cases, load)")
@LEDGER_OPT
@click.option("--no-grade", is_flag=True, help="skip grading after the run (use `evalkit grade` later)")
@click.option("--quiet", "-q", is_flag=True, help="no progress output")
def run(matrix_path: Path | None, dataset_path: Path | None, limit: int | None, seed: int, repeats: int,
        mode: str | None, concurrency: int | None, rate: float | None, sweep: str | None, stop_kv: float,
        slo: str | None, interleave: bool, resume_id: str | None, ledger: Path | None, no_grade: bool,
        quiet: bool) -> None:
    """Serve each variant of the matrix, send every case, record every request in the ledger.

    Launched variants get their own vLLM server (started, health-checked, stopped); endpoint
    variants are called as they are. Rows are written as requests finish, and each server's
    /metrics is scraped alongside so every request carries what the server did around it.
    """
    if resume_id:
        if matrix_path or dataset_path or limit or repeats != 1 or mode or concurrency or rate or sweep:
            raise UsageError("--resume takes the matrix, dataset, cases and load of the original run: "
                             "drop the other run options")
        db = open_ledger(_ledger_path(ledger), create=False)
        ctx = resume_context(db, resume_id)
        matrix, cases, dpath, load, repeats = ctx.matrix, ctx.cases, ctx.dataset_path, ctx.load, ctx.repeats
    else:
        load = build_load(mode, concurrency, rate, sweep, stop_kv, slo, interleave, seed)
        load.validate()
        matrix = load_matrix(matrix_path)
        dpath = dataset_path or default_dataset_path()
        cases = stratified_subset(load_cases(dpath), limit, seed)
        db = open_ledger(_ledger_path(ledger))
    summary = run_matrix(db, matrix, cases, dpath, repeats=repeats, seed=seed, load=load,
                         reporter=RichReporter(quiet), resume_run=resume_id)
    if not no_grade:
        names = ["schema", "persona", "formality", "drift"] + (["judge"] if matrix.judge else [])
        n = grade_run(db, summary.run_id, make_graders(names, judge=matrix.judge))
        if not quiet:
            err_console.print(f"[dim]evalkit:[/dim] graded {n} outputs")
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
def report(ledger: Path | None, run_id: str | None, as_json: bool, markdown: bool, slo: str | None) -> None:
    """Per variant and complexity: n, errors, TTFT p50/p90/p99/max, E2E mean/p50/p99, schema
    pass rate and the delta against the baseline in %; then what the server did: queue, prefill
    and decode time, KV-cache peak, preemptions, goodput."""
    if as_json and markdown:
        raise UsageError("--json and --markdown are mutually exclusive")
    db = open_ledger(_ledger_path(ledger), create=False)
    rep = build_report(db, run_id, parse_slo(slo) or None)
    if as_json:
        click.echo(to_json(rep))
    elif markdown:
        click.echo("\n\n".join(markdown_table(rep, c) for c in (COLUMNS, SERVER_COLUMNS, QUALITY_COLUMNS)))
    else:
        _print_report(rep)


def _run_judge(db: Any, run_id: str) -> Any:
    from .matrix import Matrix

    if not db["runs"].count_where("id = ?", [run_id]):
        return None
    return Matrix.model_validate_json(db["runs"].get(run_id)["matrix_json"]).judge


@cli.command()
@LEDGER_OPT
@click.option("--run", "run_id", default=None, help="run id [default: the latest run]")
@click.option("--grader", "graders", multiple=True,
              help="schema, persona, formality, drift or judge (repeatable) [default: all but judge]")
def grade(ledger: Path | None, run_id: str | None, graders: tuple[str, ...]) -> None:
    """Grade a run's outputs again without regenerating; new grader versions add rows."""
    db = open_ledger(_ledger_path(ledger), create=False)
    rid = run_id or latest_run_id(db)
    n = grade_run(db, rid, make_graders(list(graders) or None, judge=_run_judge(db, rid)))
    click.echo(f"run {rid}: {n} new grades")


@cli.group(cls=Group)
def graders() -> None:
    """Check the graders themselves."""


@graders.command("calibrate")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='labelled JSON lines {"text": ..., "level": 1-5} [default: rubrics/formality_calibration.jsonl]')
@click.option("--subset", type=click.Choice(["all", "even", "odd"]), default="all", show_default=True,
              help="lines to score (the shipped rubric was tuned on the even lines; odd ones are held out)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def graders_calibrate(path: Path | None, subset: str, as_json: bool) -> None:
    """How well the formality scorer predicts labelled levels: n, exact accuracy, accuracy
    within ±1, mean absolute error, Spearman rho, confusion matrix."""
    from .grading.formality import calibrate

    r = calibrate(path, subset=subset)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(f"{r['file']} ({r['subset']}): n={r['n']}  exact={r['exact_accuracy']:.1%}  "
               f"within ±1={r['within_1_accuracy']:.1%}  MAE={r['mae']:.2f}  Spearman rho={r['spearman_rho']:.3f}")
    click.echo("confusion (rows: labelled 1-5, columns: predicted 1-5):")
    for i, row in enumerate(r["confusion"], start=1):
        click.echo(f"  {i}: " + " ".join(f"{x:3d}" for x in row))


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
    from .paths import rubrics_dir
    from .schemas import known_schema_names, load_schema

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
    """Where the ledger is."""


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
