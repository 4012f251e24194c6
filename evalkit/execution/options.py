"""Every option of a run as one typed object, built once by keyword (the CLI, a notebook, a test)
and passed whole: a new option is one field here and the code that reads it, never another
positional argument threaded through five signatures."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .resume import refuse_resume_options
from .traces import TraceSpec


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What `evalkit run` was asked; `resolve_inputs` turns it into what the run sends."""

    matrix_path: Path | None = None  # a matrix file, a bundled name, or a workload folder
    workload: Path | None = None  # with another matrix: the workload folder whose cases, schemas and graders it runs
    dataset_path: Path | None = None
    limit: int | None = None
    time_budget: str | None = None
    trace: TraceSpec | None = None
    subset_seed: int = 0
    arrival_seed: int = 0
    repeats: int = 1
    mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    arrival: str | None = None
    max_concurrency: int | None = None
    sweep: str | None = None
    stop_kv: float | None = None
    slo: str | None = None
    client_procs: int | None = None
    order: str | None = None  # alternate, blocks, sequential, parallel (execution/order.py) [decided by the run]
    interleave: bool = False  # the old spelling of --order alternate
    max_error_rate: float | None = None
    stop_on_failure: bool = False
    resume_id: str | None = None
    retry_failed: str | None = None
    ray_address: str | None = None  # "local" for a local Ray instance; None: this process
    graders: tuple[str, ...] = ()  # --grader, over the matrix's `graders:`
    suites: tuple[str, ...] = ()  # --suite NAME[:FILE] (evalkit.suites): alone the workload, else beside it
    grader_path: Path | None = None
    grade: bool = True
    grade_sample: int | None = None

    @property
    def ray(self) -> bool:
        return self.ray_address is not None

    def with_(self, **changes: Any) -> RunOptions:
        return replace(self, **changes)

    def check(self) -> None:
        """Option conflicts that need nothing opened to be found (the ledger is opened after)."""
        if self.retry_failed and not self.resume_id:
            raise UsageError("--retry-failed goes with --resume RUN_ID")
        if not self.grade and self.grade_sample:
            raise UsageError("--grade-sample says how much to grade: it does not go with --no-grade")
        if self.resume_id:
            # a matrix may come along: only its endpoints may differ from the run's (`resume.endpoint_changes`)
            refuse_resume_options(dataset=self.dataset_path, limit=self.limit,
                                  repeats=self.repeats != 1, mode=self.mode, concurrency=self.concurrency, rate=self.rate,
                                  sweep=self.sweep, arrival=self.arrival, max_concurrency=self.max_concurrency,
                                  trace=self.trace, budget=self.time_budget)
