"""What a run will send, from the command line's options: a new run (a matrix, a dataset subset
or everything for `--time-budget`, or a trace's requests), or an interrupted one (`--resume`, with
`--retry-failed`). The rules that tie the options together live here, not in the CLI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..grading.margins import hypotheses, matrix_margins, pairs_needed
from ..grading.registry import add_path, choose, resolve, serve_only, specs, use_workload
from ..ledger import Ledger
from ..paths import default_dataset_path
from ..spec.dataset import Case, stratified_subset
from ..spec.matrix import Matrix, load_matrix, with_workload
from .load import Load, load_from_options
from .options import RunOptions
from .resume import endpoint_changes, parse_retry_classes, resume_context
from .sizing import parse_duration
from .suite_inputs import with_suites
from .traces import trace_cases, trace_json


@dataclass
class RunInputs:
    matrix: Matrix
    cases: Sequence[Case]
    dataset_path: Path
    load: Load
    repeats: int
    graders: list[str] = field(default_factory=list)  # the graders this run uses
    grader_notes: list[str] = field(default_factory=list)  # the ones skipped, and why
    time_budget_s: float | None = None
    run_extra: dict[str, Any] | None = None
    reopened: int = 0  # --retry-failed: requests that will be sent again
    opts: RunOptions = field(default_factory=RunOptions)  # what was asked: executor, grading, resume
    resume_changes: list[str] = field(default_factory=list)  # --resume with a matrix: the endpoints it changed

    @classmethod
    def of(cls, matrix: Matrix, cases: list[Case], dataset_path: Path, *, load: Load | None = None, repeats: int = 1,
           **options: Any) -> RunInputs:
        """Inputs given directly (a notebook, a benchmark, a test) rather than resolved from options."""
        return cls(matrix, cases, dataset_path, load or Load(), repeats, opts=RunOptions(repeats=repeats, **options))


def resolve_inputs(ledger: Ledger | None, q: RunOptions, say: Any = lambda s: None) -> RunInputs:
    q.check()
    budget_s = parse_duration(q.time_budget, "--time-budget") if q.time_budget else None
    if q.resume_id:
        assert ledger is not None
        ctx = resume_context(ledger, q.resume_id)
        out = RunInputs(ctx.matrix, ctx.cases, ctx.dataset_path, ctx.load, ctx.repeats)
        if q.matrix_path is not None:  # a corrected matrix: its endpoints replace the run's, nothing else may differ
            given = load_matrix(q.matrix_path)
            out.resume_changes = endpoint_changes(q.resume_id, ctx.matrix,
                                                  with_workload(given, q.workload) if q.workload else given)
        if q.retry_failed:
            out.reopened = len(ledger.reopen_failed(q.resume_id, parse_retry_classes(q.retry_failed)))
    else:
        matrix = load_matrix(q.matrix_path)
        if q.workload is not None:  # another matrix over a workload's cases, schemas and graders
            matrix = with_workload(matrix, q.workload)
        launched = any(v.launched for v in matrix.variants)
        if q.trace is not None:
            if q.dataset_path or q.limit or q.time_budget or q.concurrency or q.rate or q.sweep or q.mode:
                raise UsageError("--trace sets the requests and their arrivals: drop --dataset, --limit, --time-budget, "
                                 "--concurrency, --rate, --sweep, --mode (--max-concurrency may cap it)")
            cases, offsets, label = trace_cases(q.trace, matrix, say)
            matrix.generation.baseline_repeats = 1  # a trace is replayed once per variant
            load = load_from_options(None, max_concurrency=q.max_concurrency, stop_kv=q.stop_kv, slo=q.slo,
                                     order=q.order, order_seed=q.subset_seed,
                                     client_procs=q.client_procs, launched_locally=launched, trace_offsets=offsets,
                                     max_error_rate=q.max_error_rate, stop_on_failure=q.stop_on_failure)
            out = RunInputs(matrix, cases, Path(q.trace.path), load, 1, run_extra={"trace_json": trace_json(q.trace, label)})
        else:
            load = load_from_options(matrix.load, mode=q.mode, concurrency=q.concurrency, rate=q.rate, arrival=q.arrival,
                                     max_concurrency=q.max_concurrency, sweep=q.sweep, stop_kv=q.stop_kv, slo=q.slo,
                                     order=q.order, arrival_seed=q.arrival_seed, order_seed=q.subset_seed,
                                     client_procs=q.client_procs, launched_locally=launched,
                                     max_error_rate=q.max_error_rate, stop_on_failure=q.stop_on_failure)
            given = q.dataset_path or matrix.workload_path("dataset", "dataset.jsonl")
            dpath = given or default_dataset_path()
            suites = [*matrix.suites, *q.suites]
            all_cases = matrix.load_cases(dpath) if given or not suites else []
            # with --time-budget: every case in balanced order (any prefix is balanced); the run keeps what fits
            cases = stratified_subset(all_cases, q.limit or (len(all_cases) if budget_s else matrix.limit),
                                      q.subset_seed) if all_cases else []
            if suites:  # alone the suites are the workload; with a dataset or a workload, both run
                cases, dpath = with_suites(cases, suites, keep_dataset=bool(given), limit=q.limit, seed=q.subset_seed)
            out = RunInputs(matrix, cases, dpath, load, q.repeats)
    out.time_budget_s = budget_s
    out.opts = q
    if q.grader_path is not None:
        add_path(q.grader_path)
    use_workload(out.matrix.folder)
    if q.grade:  # which graders apply to these cases: bad case fields stop here, before anything is written
        names = list(q.graders) if q.graders else out.matrix.graders
        suite = ["accuracy"] if any(c.attributes.get("suite") for c in out.cases[:100_000]) else []  # graded for accuracy
        out.graders, out.grader_notes = choose(names, out.cases, with_judge=out.matrix.judge is not None,
                                               where=str(out.dataset_path), also=suite)
        if not q.resume_id:  # only what the chosen graders read is sent (a resumed run keeps what it recorded)
            out.grader_notes += serve_only(out.matrix, out.graders)
    elif out.matrix.graders:  # not grading now, but a plugin grader the matrix names declares margins too
        resolve(out.matrix.graders)
    if not q.resume_id:  # after the graders are known: a plugin's margins are margins
        check_margins(out, say)
    out.run_extra = {**(out.run_extra or {}), "graders_json": json.dumps(specs(out.graders)),
                     "workload_dir": str(out.matrix.folder) if out.matrix.folder else None}
    return out


def check_margins(inp: RunInputs, say: Any) -> None:
    """The matrix's margins, before anything is sent: a metric no verdict can read is refused, and
    a fixed number of cases too small to decide them is said (`--time-budget` stretches instead)."""
    if not inp.matrix.margins:
        return
    margins = matrix_margins(inp.matrix, resolved=True)  # the graders are resolved: `matrix validate` does both
    need, per_pair = pairs_needed(margins), inp.load.cases_per_pair()
    if inp.time_budget_s is None and len(inp.cases) < need * per_pair:
        blocks = f" ({need} pairs, each a block of {per_pair} cases the variants alternate in)" if per_pair > 1 else ""
        say(f"{len(inp.cases)} cases cannot decide the matrix's margins ({hypotheses(margins)} hypotheses under Holm): "
            f"at least {need * per_pair} needed{blocks}, so every verdict will read inconclusive (docs/verdicts.md)")
