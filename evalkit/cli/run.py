"""`evalkit run`: serve each variant, send the cases, record and grade."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import LedgerWriteError, UsageError
from ..execution.error_classes import DEFAULT_RETRY_CLASSES
from .common import LEDGER_OPT, EvalkitClickError, cli, command_ledger, ledger_path
from .console import RichProgress, print_closing, print_report


@cli.command()
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="matrix YAML, or a bundled name (default, capacity, saturation, drift-control) "
                   "[default: the embedded unquantized vs W8A8 matrix]")
@click.option("--workload", "workload", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="a workload folder: its matrix.yaml, dataset, schemas/, rubrics/ and graders (docs/workloads.md); "
                   "with --matrix, that matrix over the folder's cases, schemas and graders")
@click.option("--dataset", "dataset_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="dataset JSONL [default: the workload's, else data/resume_gen_benchmark.jsonl]")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="run a stratified subset of N cases (balanced over complexity and task)")
@click.option("--time-budget", default=None, metavar="DURATION",
              help="size the run to this machine: keep as many stratified cases as fit this time, e.g. 10m (measured "
                   "from the first variant's timing probes); prints what that buys")
@click.option("--suite", "suites", multiple=True, metavar="NAME[:FILE]",
              help="an evaluation suite graded for accuracy (repeatable, or comma-separated): instructions, "
                   "arithmetic, choice, or your own gsm8k:FILE, mmlu:FILE, arc:FILE, ifeval:FILE; alone it is the "
                   "workload, with --dataset or --workload both run (docs/suites.md)")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="replay a trace: its arrivals at their recorded offsets (open loop), its lengths or messages")
@click.option("--trace-format", type=click.Choice(["mooncake", "azure", "burstgpt", "evalkit"]), default=None,
              help="the trace's format (docs/traffic.md)")
@click.option("--speedup", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="replay the trace this many times faster")
@click.option("--trace-limit", type=click.IntRange(min=1), default=None, help="replay only the first N rows")
@click.option("--subset-seed", type=int, default=None, help="which cases --limit picks, and the alternation's order [0]")
@click.option("--arrival-seed", type=int, default=None, help="the Poisson arrival schedule of --rate [0]")
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
@click.option("--stop-kv", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="sweep saturation: peak KV-cache use at or above this fraction [0.9, or the matrix's load:]")
@click.option("--slo", default=None,
              help="per-request limits for goodput and the sweep: ttft=2000,tpot=100,e2e=10000 (ms) or relative to "
                   "the same case at concurrency 1: ttft=3x,e2e=3x; with --search, p99 goals: ttft_p99=2s,itl_p99=80ms")
@click.option("--search", type=click.Choice(["rate", "concurrency"]), default=None,
              help="find each variant's capacity frontier: the highest rate (or concurrency) it sustains at the --slo "
                   "without over-saturating, bracketed and bisected (docs/capacity.md)")
@click.option("--max-probes", type=click.IntRange(min=3), default=None,
              help="with --search: load levels per variant, its reference and throughput burst included [8]")
@click.option("--search-time", default=None, metavar="DURATION",
              help="with --search: the whole search's time, shared equally by the variants; probes are planned "
                   "from it, and a search out of time ends with the bracket it reached [10m]")
@click.option("--client-procs", type=int, default=None,
              help="processes sending the load, each with its own event loop [what the host can spare: 1 beside a "
                   "launched server, else half the cores up to 8]")
@click.option("--order", type=click.Choice(["alternate", "blocks", "sequential", "parallel"]), default=None,
              help="how the variants share time: alternate (all up; each case's requests side by side, a loaded "
                   "level chunk by chunk), blocks (one server at a time, A B B A), sequential (one variant after "
                   "the other: verdicts say so), parallel (Ray) [alternate where every server fits, else blocks]")
@click.option("--interleave", is_flag=True, hidden=True, help="the old spelling of --order alternate")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="run each variant (or replica) as a Ray task: `--ray` alone starts a local Ray instance; "
                   "or give auto / ray://HOST:10001")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="complete the requests missing from an interrupted run (same matrix, cases, load); with --matrix "
                   "or --workload, a matrix that differs from the run's only in endpoints (a corrected URL)")
@click.option("--retry-failed", "retry_failed", is_flag=False, flag_value=",".join(DEFAULT_RETRY_CLASSES), default=None,
              metavar="[CLASSES]", help="with --resume: also send again the requests whose final row failed with one "
                                        f"of these error classes [{','.join(DEFAULT_RETRY_CLASSES)}]; the old rows stay")
@click.option("--max-error-rate", type=click.FloatRange(0, 1), default=None,
              help="a variant with a larger share of failed requests is `failed` and the run exits 1 [0.5]")
@click.option("--stop-on-failure", is_flag=True, help="stop the run when a variant fails (default: go on with the next)")
@LEDGER_OPT
@click.option("--no-grade", is_flag=True, help="skip grading after the run (use `evalkit grade` later)")
@click.option("--grade-sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="grade up to N cases per slice (load level × complexity), every variant's requests for each, "
                   "not every output: for runs far larger than their quality question (the report says so)")
@click.option("--grader", "graders", multiple=True, metavar="NAME|module:Class",
              help="a grader to run (repeatable) [default: the matrix's `graders:`, else every default grader whose "
                   "fields the cases carry]")
@click.option("--grader-path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="a folder to import module:Class graders from [default: the workload folder]")
@click.option("--quiet", "-q", is_flag=True, help="no progress output")
def run(workload: Path | None, trace_path: Path | None, trace_format: str | None, speedup: float,
        trace_limit: int | None, subset_seed: int | None, arrival_seed: int | None, ledger: Path | None,
        no_grade: bool, graders: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Serve each variant of the matrix, send every case, record every request in the ledger.

    Launched variants get their own vLLM server (started, health-checked, stopped); endpoint
    variants are called as they are. Rows are written as requests finish, and each server's
    /metrics is scraped alongside so every request carries what the server did around it.
    """
    from ..execution.inputs import resolve_inputs
    from ..execution.options import RunOptions
    from ..execution.search import SearchRequest
    from ..execution.signals import Interrupted, graceful_stop
    from ..execution.traces import TraceSpec
    from ..execution.workflow import run_and_grade
    from ..reporting.findings import report_findings
    from ..sharing.browse import store_derived
    from .liveview import progress_for

    if trace_path is not None and trace_format is None:
        raise UsageError("--trace needs --trace-format (mooncake, azure, burstgpt or evalkit)")
    search = SearchRequest.take(options)  # --search takes over --slo and --arrival; other shapes refused
    # --workload DIR --matrix FILE: the folder's cases, schemas and graders under another matrix
    other = workload is not None and options["matrix_path"] is not None
    opts = RunOptions(**{**options, "matrix_path": options["matrix_path"] or workload,
                         "workload": workload if other else None,
                         "trace": TraceSpec(str(trace_path), trace_format or "", speedup, trace_limit) if trace_path else None,
                         "subset_seed": subset_seed or 0, "arrival_seed": arrival_seed or 0, "graders": graders,
                         "grade": not no_grade})
    opts.check()
    resume_id = opts.resume_id
    db = command_ledger(ledger_path(ledger), create=False) if resume_id else None
    inp = resolve_inputs(db, opts, RichProgress(quiet).say)  # bad input stops here: nothing written yet
    if search is not None:
        inp.load = search.load(inp.load, inp.matrix.load.slo if inp.matrix.load else None, opts.arrival_seed,
                               len(inp.matrix.variants))
    db = db or command_ledger(ledger_path(ledger))
    for line in inp.resume_changes:
        click.echo(line)
    if inp.reopened or opts.retry_failed:
        click.echo(f"run {resume_id}: {inp.reopened} failed requests will be sent again (their rows stay, not final)")
    progress = progress_for(quiet, {v.name: v.endpoint_of(None) for v in inp.matrix.variants})  # live on a terminal
    for note in inp.grader_notes:
        progress.say(note)
    path = ledger_path(ledger)
    try:
        with graceful_stop():
            summary, n, grade_s = run_and_grade(db, inp, progress)
    except (Interrupted, LedgerWriteError) as e:
        rid = getattr(e, "run_id", None) or resume_id
        hint = f"; resume with `evalkit run --resume {rid} --ledger {path}`" if rid else ""
        raise EvalkitClickError(f"{str(e).splitlines()[0]}: run {rid} is interrupted{hint}", e.exit_code) from None
    if not no_grade:
        progress.say(f"graded {n} outputs in {grade_s:.1f} s")
    skipped = f", {summary.n_skipped} already in the ledger (skipped)" if resume_id else ""
    failed = (f"; {len(summary.failed_variants)} variant(s) failed: {', '.join(summary.failed_variants)}"
              if summary.failed_variants else "")
    click.echo(f"run {summary.run_id}: {summary.n_requests} requests, {summary.n_errors} errors{skipped}{failed} "
               f"-> {path}")
    for name, why in summary.saturation.items():
        click.echo(f"{name}: {why}")
    if not quiet:
        rep, fnd = report_findings(db, summary.run_id)  # ledger queries: the run's rows are not read
        store_derived(db, summary.run_id, fnd)  # what `browse` shows, computed once here
        print_report(rep, fnd)
        print_closing(fnd, str(path))
    unrecorded = (f"; and the run's end could not be recorded ({summary.unrecorded}): it reads as stale, resume it"
                  if summary.unrecorded else "")
    if summary.failed_variants:
        names = ", ".join(f"{k} ({v})" for k, v in summary.failed_variants.items())
        raise EvalkitClickError(f"variant(s) failed: {names}{unrecorded}", 1)
    if unrecorded:
        raise EvalkitClickError(unrecorded.removeprefix("; and "), 1)
    if not no_grade:
        from .grade import incomplete

        incomplete(db, summary.run_id)  # a grader that raised: its failures named, exit 1
