"""The whole job, as the CLI's `run` does it: run the matrix, then grade what it produced.
Kept out of the CLI so that other front ends (a notebook, Ray) do the same thing."""

from __future__ import annotations

import time
from pathlib import Path

from ..grading import GraderContext, GradeSample, grade_run, make_graders
from ..ledger import Ledger
from ..spec.dataset import Case
from ..spec.matrix import Matrix
from .load import Load
from .runner import Progress, RunSummary, run_matrix


def run_and_grade(ledger: Ledger, matrix: Matrix, cases: list[Case], dataset_path: Path, *, repeats: int = 1,
                  subset_seed: int = 0, load: Load | None = None, progress: Progress | None = None,
                  resume_run: str | None = None, grade: bool = True,
                  ray_address: str | None = None, time_budget_s: float | None = None,
                  run_extra: dict | None = None, graders: list[str] | None = None,
                  grade_sample: int | None = None) -> tuple[RunSummary, int, float]:
    """Returns the run's summary, the number of grades added (0 with grade=False) and the
    seconds grading took. ``graders``: the ones that apply to the run's cases (`registry.choose`);
    ``grade_sample``: grade up to this many cases per slice (`GradeSample`), not every one.
    With ``ray_address`` ("local" for a local Ray instance) each variant runs as a Ray task and
    embeddings for grading are computed on Ray workers."""
    ctx = GraderContext(judge=matrix.judge, quality_under_load=matrix.generation.quality_under_load,
                        rubrics=matrix.workload_path("rubrics", "rubrics"))
    if ray_address is not None:
        from .cluster import ray_embed, run_matrix_ray

        summary = run_matrix_ray(ledger, matrix, cases, dataset_path, address=ray_address, repeats=repeats,
                                 subset_seed=subset_seed, load=load, progress=progress, resume_run=resume_run)
        ctx.embed = ray_embed(ray_address)
    else:
        summary = run_matrix(ledger, matrix, cases, dataset_path, repeats=repeats, subset_seed=subset_seed, load=load,
                             progress=progress, resume_run=resume_run, time_budget_s=time_budget_s,
                             run_extra=run_extra)
    if not grade:
        return summary, 0, 0.0
    t0 = time.monotonic()
    if not graders:
        return summary, 0, 0.0
    n = grade_run(ledger, summary.run_id, make_graders(graders, ctx),
                  GradeSample(grade_sample) if grade_sample else None)
    return summary, n, time.monotonic() - t0
