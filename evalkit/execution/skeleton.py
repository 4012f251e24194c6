"""The one run skeleton: start a run (or reopen it for `--resume`) with every extra it carries,
let an executor send its variants, finish it whatever happened. Executors plug in under it —
this process (`InProcess`, with or without `--client-procs` sending processes) and Ray
(`cluster.OnRay`) — and refuse, in one line before anything is written, what they cannot carry
(docs/architecture.md has the executors x features table)."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import replace
from itertools import chain, islice
from pathlib import Path
from typing import Protocol

from .. import __version__
from ..engines.memory import plan_memory
from ..errors import EvalkitError, LedgerWriteError, UsageError
from ..host import this_host
from ..ledger import DoneKeys, HeldKeys, Ledger, dumps, utcnow
from ..measure.envload import EnvSampler
from ..paths import cache_dir
from ..redact import redact, redact_args
from ..spec.dataset import dataset_hash
from ..spec.matrix import Matrix
from ..spec.spool import SpooledCases
from .blocks import run_blocks
from .inputs import RunInputs
from .load import Load, warmup_cases
from .order import Order, host_order
from .preflight import preflight
from .runner import Progress, RunContext, RunSummary, SilentProgress, case_rows, run_group


def new_run_id() -> str:
    return utcnow()[:10].replace("-", "") + "-" + uuid.uuid4().hex[:8]


def create_run(ledger: Ledger, inp: RunInputs, load: Load) -> str:
    """The run's record: its matrix, cases, load and every extra the inputs carry (graders,
    workload, trace), whichever executor sends it."""
    matrix, cases, dataset_path, repeats = inp.matrix, inp.cases, inp.dataset_path, inp.repeats
    run_id = new_run_id()
    dhash = dataset_hash(dataset_path)
    gen = matrix.generation
    host = this_host()  # first: a bad EVALKIT_EMULATE_CPU stops the run before anything is written
    turns = (c.turn_case(k) for c in cases for k in range(1, len(c.turns) + 1))  # each turn is graded as a case
    every = chain(cases, turns, warmup_cases(cases, gen.warmup, gen.structured_output))
    while part := list(islice(every, 5000)):  # in parts: a trace's cases are not held
        ledger.record_cases(case_rows(part, dhash))
    host_id = ledger.record_host(host)
    ledger.create_run({
        "id": run_id, "created_at": utcnow(), "finished_at": None, "status": "running",
        "matrix_name": matrix.name, "matrix_json": redact(matrix.model_dump_json()),
        "dataset_path": str(dataset_path), "dataset_hash": dhash, "n_cases": len(cases),
        "case_ids_json": dumps([c.id for c in cases]), "seed": inp.opts.subset_seed,
        "evalkit_version": __version__, "python_version": platform.python_version(),
        "host": socket.gethostname(), "platform": platform.platform(), "host_id": host_id,
        "argv": " ".join(redact_args(sys.argv)),
        "load_json": dumps({**load.record(), "repeats": repeats}), "pid": os.getpid(), **(inp.run_extra or {}),
    })
    return run_id


def start_run(ledger: Ledger, inp: RunInputs, load: Load, progress: Progress) -> tuple[RunSummary, DoneKeys | HeldKeys]:
    """Create the run (or reopen it for --resume) and say what will be sent."""
    resume_run, matrix, repeats = inp.opts.resume_id, inp.matrix, inp.repeats
    if resume_run:
        run_id = resume_run
        # a corrected matrix's endpoints are the run's from now on
        changed = {"matrix_json": redact(matrix.model_dump_json())} if inp.resume_changes else {}
        ledger.update_run(run_id, {"status": "running", "finished_at": None, "pid": os.getpid(), "host": socket.gethostname(),
                                   "stop_reason": None, **changed})
    else:
        run_id = create_run(ledger, inp, load)
    skip = ledger.done_keys(run_id) if resume_run else HeldKeys()
    floor = matrix.generation.baseline_passes(repeats)
    progress.say(f"run {run_id}: {len(matrix.variants)} variants x {len(inp.cases)} cases x {repeats} repeats"
                 + (f" (baseline x{floor}: the extra pass is drift's noise floor)" if floor > repeats else "")
                 + (f" (resuming: {len(skip)} requests already in the ledger)" if resume_run else ""))
    return RunSummary(run_id), skip


def finish_run(ledger: Ledger, matrix: Matrix, summary: RunSummary, ok: bool, reason: str | None = None) -> None:
    """The run ends `complete` (every variant complete), `failed` (a variant failed) or
    `interrupted` (stopped before the end: a signal, a full disk, a crash); never `running`. A
    ledger that cannot be written any more (a full disk) leaves the status as it is: a run
    `running` whose process is gone reads as stale."""
    failed = bool(summary.failed_variants)
    status = ("failed" if failed else "complete") if ok else "interrupted"
    try:
        left = ledger.close_open_variants(summary.run_id, "failed" if ok else "interrupted",
                                          reason or ("the run ended before this variant did" if ok else
                                                     "the run was interrupted"))
        for name in left:
            summary.failed_variants.setdefault(name, reason or "left running when the run ended")
        ledger.update_run(summary.run_id, {"status": status, "finished_at": utcnow(), "stop_reason": reason})
    except LedgerWriteError as e:
        summary.unrecorded = str(e).splitlines()[0]


class Executor(Protocol):
    """Where a run's variants are sent from. The skeleton (`run_matrix`) starts the run, records its
    extras and finishes it; an executor only runs the variants' groups under it, and refuses, in
    one line before anything is written, a feature it cannot carry."""

    name: str

    def refuse(self, inp: RunInputs, load: Load) -> str | None: ...
    def run_variants(self, ctx: RunContext) -> None: ...


class InProcess:
    """Every variant from this process: all up at once and alternated (the default), one server at a
    time in balanced blocks, or one after the other when asked (`order.py`); its requests from
    this event loop or from `--client-procs` sending processes."""

    name = "this process"
    parallel = False

    def refuse(self, inp: RunInputs, load: Load) -> str | None:
        if load.policy.order.kind == "blocks" and inp.time_budget_s is not None:
            return ("--time-budget sizes the run from probes with every variant up; with one server at a time "
                    "(--order blocks) give --limit N")
        return None

    def run_variants(self, ctx: RunContext) -> None:
        load, seq = ctx.load, ctx.ledger.max_seq(ctx.run_id)
        names = [v.name for v in ctx.matrix.ordered_variants()]
        kind = load.policy.order.kind
        if kind == "blocks":
            run_blocks(ctx, names, seq)
            return
        groups = [names] if kind == "alternate" else [[n] for n in names]
        for gi, group in enumerate(groups):
            seq = run_group(ctx, group, seq, variants_after=len(groups) - gi - 1)
            if self._stop_after_failure(ctx):
                break

    @staticmethod
    def _stop_after_failure(ctx: RunContext) -> bool:
        if ctx.load.policy.stop_on_failure and ctx.summary.failed_variants:
            ctx.stop_reason = f"stopped after a failed variant ({', '.join(ctx.summary.failed_variants)})"
            ctx.progress.say(ctx.stop_reason)
            return True
        return False


def executor_for(inp: RunInputs) -> Executor:
    if inp.opts.ray_address is not None:
        from .cluster import OnRay

        return OnRay(inp.opts.ray_address)
    return InProcess()


def run_matrix(ledger: Ledger, inp: RunInputs, progress: Progress | None = None, *, executor: Executor | None = None,
               log_dir: Path | None = None) -> RunSummary:
    """The one run skeleton: refuse what the executor cannot carry, plan memory, start (or reopen)
    the run with its extras, let the executor send, finish the run whatever happened."""
    progress = progress or SilentProgress()
    executor = executor or executor_for(inp)
    load = inp.load.for_matrix(inp.matrix.generation.quality_under_load)
    resume_run, budget = inp.opts.resume_id, inp.time_budget_s
    if budget is not None and not resume_run and (load.pattern.saturates or any(lv.open_loop for lv in load.levels())):
        raise UsageError("--time-budget sizes sequential and fixed-concurrency runs; a sweep or --rate takes --limit")
    if not resume_run:  # an order the options cannot have (--order alternate with --ray): before anything else
        decide_order(inp, load, executor, {}, check_only=True)
    if (why := executor.refuse(inp, load)) is not None:
        raise UsageError(why)
    memory = plan_memory(inp.matrix, progress.say)  # a memory budget that cannot fit stops here, before anything is written
    # so does a wrong URL or a server that cannot start: found now, not after the baseline was sent
    preflight(inp.matrix, local_launch=isinstance(executor, InProcess))
    if not resume_run:  # the order the variants share time in: decided once, recorded, kept by a resume
        load.policy.order = decide_order(inp, load, executor, memory)
        if (why := executor.refuse(inp, load)) is not None:  # what the chosen order cannot carry
            raise UsageError(why)
    if len(inp.matrix.variants) > 1:
        progress.say(f"order: {load.policy.order.kind} ({load.policy.order.why})")
    if not resume_run and (plan := load.pattern.plan_line(load.stops)):
        progress.say(plan)
    summary, skip = start_run(ledger, inp, load, progress)
    cases = inp.cases if isinstance(inp.cases, SpooledCases) else list(inp.cases)  # a trace's stay on disk
    ctx = RunContext(ledger, summary.run_id, inp.matrix, cases, inp.repeats, load, skip, progress,
                     log_dir or cache_dir() / "logs", summary, memory,
                     time_budget_s=budget if not resume_run else None,
                     # one clock for the whole run; a resumed run's goes on a minute after its last request
                     epoch=time.perf_counter() - ((ledger.max_mono_ms(summary.run_id) + 60_000.0) / 1000.0
                                                  if resume_run else 0.0))
    sampler = machine_sampler(ctx, executor)  # the machine's load beside the run (measure/envload.py)
    ok = False
    try:
        executor.run_variants(ctx)
        ok = True
    except BaseException as e:
        ctx.stop_reason = stop_reason(e)
        if isinstance(e, (EvalkitError,)):
            e.run_id = summary.run_id  # type: ignore[attr-defined]
        raise
    finally:
        if sampler is not None:
            sampler.stop()
        finish_run(ledger, inp.matrix, summary, ok, ctx.stop_reason)
    return summary


def machine_sampler(ctx: RunContext, executor: Executor) -> EnvSampler | None:
    """The load sampler of a run sent from this process, started (a Ray run's variants run on their
    workers' machines: not sampled here). Its rows share the requests' clock (`ctx.epoch`)."""
    if getattr(executor, "parallel", False) or not ctx.matrix.telemetry.machine_load:
        return None
    endpoints = {v.name: [u for r in range(v.n_replicas) if (u := v.endpoint_of(r if v.n_replicas > 1 else None))]
                 for v in ctx.matrix.variants if not v.launched}
    s = EnvSampler(ctx.ledger, ctx.run_id, ctx.epoch or time.perf_counter(),
                   known_pids=lambda: {k: set(v) for k, v in list(ctx.pids.items())}, endpoints=lambda: endpoints)
    s.start()
    return s


def decide_order(inp: RunInputs, load: Load, executor: Executor, memory: dict, check_only: bool = False) -> Order:
    """The order this run's variants share time in, and why (`order.py`): alternated where every
    server fits at once, in balanced blocks where one does, one after the other only when asked.
    ``check_only``: the options' conflicts alone, before the memory planner runs."""
    m = inp.matrix
    launched = [v for v in m.variants if v.launched]
    asked = load.policy.order.kind or None
    fits = (True, "")
    if len(launched) > 1 and asked not in ("sequential", "parallel") and not getattr(executor, "parallel", False) \
            and not check_only:
        from ..engines.memory import fit_together

        fits = fit_together(m, memory, gpu=bool(this_host().get("gpu_json")))
    order = host_order(asked, variants=len(m.variants), launched=len(launched), fit_together=fits,
                       ray=bool(getattr(executor, "parallel", False)), adaptive=load.pattern.adaptive,
                       interleave=bool(inp.opts.interleave))
    return replace(order, seed=load.policy.order.seed, chunk=load.policy.order.chunk, min_blocks=blocks_needed(m))


def blocks_needed(m: Matrix) -> int:
    """The chunks a loaded level is cut into: as many as its margins need pairs (each chunk is one
    pair of its verdicts: `reporting.pairing`), at least four."""
    from ..grading.margins import pairs_needed, parse_margins

    specs = parse_margins(m.margins, "matrix margins") if m.margins else []
    return max(4, pairs_needed(specs)) if specs else 4


def stop_reason(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "stopped by SIGINT"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


