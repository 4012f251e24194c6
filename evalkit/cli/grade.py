"""`evalkit grade`, `graders list|calibrate` and `rubrics validate`: every grader from the registry."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import UsageError
from ..paths import rubrics_dir
from .common import LEDGER_OPT, RUN_OPT, Group, cli, ledger_path


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--grader", "graders", multiple=True,
              help="a registered grader (repeatable; `evalkit graders list`) [default: the default ones]")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="grade up to N cases per slice (load level × complexity), every variant's requests for each "
                   "[default: every output]")
def grade(ledger: Path | None, run_id: str | None, graders: tuple[str, ...], sample: int | None) -> None:
    """Grade a run's outputs again without regenerating; new grader versions add rows."""
    from ..grading import GradeSample, grade_run, make_graders
    from ..grading.judge import context_of_run
    from ..grading.registry import use_run
    from ..ledger import open_ledger

    db = open_ledger(ledger_path(ledger), create=False)
    run = db.require_run(run_id)
    recorded = use_run(run)  # the run's own graders (and its workload's modules) unless --grader names others
    ctx = context_of_run(run["matrix_json"])
    if run.get("workload_dir"):
        ctx.rubrics = Path(run["workload_dir"]) / (run.matrix.get("rubrics") or "rubrics")
    n = grade_run(db, run["id"], make_graders(list(graders) or recorded, ctx), GradeSample(sample) if sample else None)
    click.echo(f"run {run['id']}: {n} new grades")


@cli.group(cls=Group)
def graders() -> None:
    """The registered graders: what each offers, and how well each agrees with labels."""


@graders.command("list")
def graders_list() -> None:
    """Every registered grader (built-in and plugins, entry point group `evalkit.graders`): its
    summary columns, the thresholds `check --threshold` takes, its margins, canned queries and
    calibration file."""

    from ..grading import available

    for name, cls in available().items():
        cols = ", ".join(c.key for c in cls.aggregate.columns)
        click.echo(f"{name} v{cls.version} ({cls.kind}{', default' if cls.default else ''}): {cls.description} [{cols}]")
        for t in cls.aggregate.thresholds:
            click.echo(f"  threshold {t.name} ({t.direction}): {t.description}")
        for m in cls.aggregate.margins:
            click.echo(f"  margin {m.name} ({m.unit}, {'higher' if m.higher_is_better else 'lower'} is better): "
                       f"{m.description}")
        for q in cls.aggregate.canned_queries:
            click.echo(f"  canned query {q.name}: {q.title}")
        if cls.calibration_file:
            click.echo(f"  calibration: rubrics/{cls.calibration_file}")


@graders.command("calibrate")
@click.option("--grader", default="formality", show_default=True, help="a grader with calibration data")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="labelled JSON lines [default: the grader's own, e.g. rubrics/formality_test.jsonl, the held-out "
                   "test file]")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def graders_calibrate(grader: str, path: Path | None, as_json: bool) -> None:
    """How well a grader agrees with labels (formality: both estimators — n, exact, within ±1,
    MAE, Spearman rho, recall per level, confusion, their agreement; persona: per-rule precision
    and recall of the rule's failures, and accuracy)."""
    from ..grading import available
    from ..grading.registry import calibratable

    choices = calibratable()
    if grader not in choices:
        raise UsageError(f"--grader: '{grader}' has no calibration data (graders that have: {', '.join(choices)})")
    cls = available()[grader]
    r = cls.calibrate(path)
    click.echo(json.dumps(r, indent=2) if as_json else "\n".join(cls.calibration_lines(r)))


@cli.group(cls=Group)
def rubrics() -> None:
    """Check rubric and schema files."""


@rubrics.command("validate")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="rubrics directory [default: rubrics/]")
def rubrics_validate(directory: Path | None) -> None:
    """Load every registered grader's rubric files, reporting the first error (file:line, field)."""

    from ..grading import available

    d = directory or rubrics_dir()
    parts = [x for cls in available().values() if (x := cls.validate_rubrics(d))]
    click.echo(f"{d}: OK — " + "; ".join(parts))
