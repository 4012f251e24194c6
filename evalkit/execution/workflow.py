"""The whole job, as the CLI's `run` does it: run the matrix, then grade what it produced.
Kept out of the CLI so that other front ends (a notebook, Ray) do the same thing."""

from __future__ import annotations

import time

from ..grading import GraderContext, GradeSample, grade_run, make_graders
from ..ledger import Ledger
from .inputs import RunInputs
from .runner import Progress, RunSummary
from .skeleton import executor_for, run_matrix


def run_and_grade(ledger: Ledger, inp: RunInputs, progress: Progress | None = None) -> tuple[RunSummary, int, float]:
    """Run the inputs on their executor (`inp.opts.ray_address`: Ray, else this process), then
    grade with the graders that apply (`inp.graders`; `opts.grade_sample`: up to that many cases
    per slice). Returns the run's summary, the number of grades added and the seconds grading took.
    On Ray, embeddings for grading are computed on Ray workers too."""
    opts = inp.opts
    ctx = GraderContext(judge=inp.matrix.judge, quality_under_load=inp.matrix.generation.quality_under_load,
                        rubrics=inp.matrix.workload_path("rubrics", "rubrics"))
    summary = run_matrix(ledger, inp, progress, executor=executor_for(inp))
    if opts.ray_address is not None:
        from .cluster import ray_embed

        ctx.embed = ray_embed(opts.ray_address)
    if not opts.grade or not inp.graders:
        return summary, 0, 0.0
    t0 = time.monotonic()
    n = grade_run(ledger, summary.run_id, make_graders(inp.graders, ctx),
                  GradeSample(opts.grade_sample) if opts.grade_sample else None)
    return summary, n, time.monotonic() - t0
