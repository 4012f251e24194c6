"""`evalkit grade`, `graders list|calibrate` and `rubrics validate`: every grader from the registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import EvalkitError, GradingIncomplete, UsageError
from ..paths import rubrics_dir
from .common import LEDGER_OPT, RUN_OPT, Group, cli, command_ledger, ledger_path

if TYPE_CHECKING:  # the library loads in the commands that use it: --help stays fast
    from ..ledger import Ledger

GRADER_PATH_OPT = click.option(
    "--grader-path", "grader_paths", multiple=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="a folder of grader modules (repeatable): its graders can be named, their metrics, margins and thresholds "
         "used [default: the ones each run recorded, and its workload folder]")


def use_graders(db: Ledger, run_id: str | None, grader_paths: tuple[Path, ...] = (), every_run: bool = False) -> None:
    """Before a command names a metric, margin or threshold: the run's graders (or every run's),
    and those of each --grader-path (`registry.use`)."""
    from ..grading.registry import use

    use(db, run_id, grader_paths, every_run=every_run)


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--grader", "graders", multiple=True,
              help="a registered grader or module:Class (repeatable; `evalkit graders list`) [default: the run's own]")
@GRADER_PATH_OPT
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="grade up to N cases per slice (load level × complexity), every variant's requests for each "
                   "[default: every output]")
@click.option("--retry-failed", is_flag=True,
              help="grade again the requests a grader failed on (their error grades stay; the new grade counts)")
def grade(ledger: Path | None, run_id: str | None, graders: tuple[str, ...], grader_paths: tuple[Path, ...],
          sample: int | None, retry_failed: bool) -> None:
    """Grade a run's outputs again without regenerating; new grader versions add rows. A grader
    that raises on a request leaves an error grade for it and grades every other one; the command
    then names what failed and exits 1."""
    from ..grading import GradeSample, grade_run, make_graders
    from ..grading.judge import context_of_run
    from ..grading.registry import record, resolve, use

    db = command_ledger(ledger_path(ledger), create=False)
    run = db.require_run(run_id)
    # the run's own graders (its workload's modules, each from its own folder) unless --grader names others
    recorded = use(db, run["id"], grader_paths)
    ctx = context_of_run(run["matrix_json"])
    if run.get("workload_dir"):
        ctx.rubrics = Path(run["workload_dir"]) / (run.matrix.get("rubrics") or "rubrics")
    chosen = resolve(list(graders)) if graders else recorded
    n = grade_run(db, run["id"], make_graders(chosen, ctx), GradeSample(sample) if sample else None,
                  retry_failed=retry_failed)
    if graders:
        record(db, run["id"], chosen or [])
    click.echo(f"run {run['id']}: {n} new grades")
    incomplete(db, run["id"])


def incomplete(db: Ledger, run_id: str) -> None:
    """One line per grader that failed on some requests, and exit 1: grading is incomplete."""
    from ..grading import grade_failures

    lines = grade_failures(db, run_id)
    for line in lines:
        click.echo(line)
    if lines:
        raise GradingIncomplete(f"grading incomplete: {len(lines)} grader(s) failed on some requests (error grades "
                                f"in the ledger); fix the grader, then `evalkit grade --run {run_id} --retry-failed`")


@cli.group(cls=Group)
def graders() -> None:
    """The registered graders: what each offers, and how well each agrees with labels."""


@graders.command("list")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also the graders its runs recorded [default: $EVALKIT_LEDGER or ./evalkit.db, when it exists]")
@click.option("--workload", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="also a workload folder's graders [default: the current folder, when it holds a matrix.yaml]")
@GRADER_PATH_OPT
def graders_list(ledger: Path | None, workload: Path | None, grader_paths: tuple[Path, ...]) -> None:
    """Every registered grader (built-in, plugins of entry point group `evalkit.graders`, the
    modules of a workload folder or --grader-path, the ones the ledger's runs recorded): its
    summary columns, the thresholds `check --threshold` takes, its margins, canned queries and
    calibration file."""
    from ..grading import available
    from ..grading.registry import BUILTINS, UNRESOLVED, origin, use, workload_here

    use(paths=grader_paths, workload=workload or workload_here())
    path = ledger_path(ledger)
    if path.is_file():
        try:
            use(command_ledger(path, create=False), every_run=True)
        except EvalkitError as e:  # a listing does not fail on a ledger it only looks into
            UNRESOLVED[str(path)] = str(e).splitlines()[0]
    for name, cls in available().items():
        cols = ", ".join(c.key for c in cls.aggregate.columns)
        click.echo(f"{name} v{cls.version} ({cls.kind}{', default' if cls.default else ''}): {cls.description} "
                   f"[{cols}]")
        if name not in BUILTINS:
            click.echo(f"  from: {origin(name)}")
        for t in cls.aggregate.thresholds:
            click.echo(f"  threshold {t.name} ({t.direction}): {t.description}")
        for m in cls.aggregate.margins:
            click.echo(f"  margin {m.name} ({m.unit}, {'higher' if m.higher_is_better else 'lower'} is better): "
                       f"{m.description}")
        for q in cls.aggregate.canned_queries:
            click.echo(f"  canned query {q.name}: {q.title}")
        if cls.calibration_file:
            click.echo(f"  calibration: rubrics/{cls.calibration_file}")
        if cls.requires:
            click.echo(f"  reads: {', '.join(cls.requires)}")
    for target, why in UNRESOLVED.items():
        click.echo(f"not loaded: {target}: {why}")


@graders.command("calibrate")
@click.option("--grader", default="formality", show_default=True, help="a grader with calibration data")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="labelled JSON lines [default: the grader's own, e.g. rubrics/formality_test.jsonl, the held-out "
                   "test file]")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--reviews", "use_reviews", is_flag=True,
              help="against the reviews of a ledger's run (`browse --review`): Cohen's kappa of the grader's pair "
                   "verdicts, per rule")
@LEDGER_OPT
@RUN_OPT
@GRADER_PATH_OPT
@click.option("--judge-endpoint", default=None, metavar="URL", help="the judge's OpenAI-compatible server (--grader judge)")
@click.option("--judge-model", default=None, metavar="NAME", help="the judge's model name (--grader judge)")
@click.option("--judge-max-tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="the judge's answer length (--grader judge) [default: the matrix default, 200]")
@click.option("--judge-structured", "judge_structured_output", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, metavar="MODE",
              help="constrain the judge's answer to {score: 1-5, reason} (a JSON schema response_format): auto "
                   "(when the endpoint is vLLM), on, off")
def graders_calibrate(grader: str, path: Path | None, as_json: bool, use_reviews: bool, ledger: Path | None,
                      run_id: str | None, grader_paths: tuple[Path, ...], judge_endpoint: str | None,
                      judge_model: str | None, judge_max_tokens: int | None, judge_structured_output: str) -> None:
    """How well a grader agrees with labels (formality: both estimators — n, exact, within ±1,
    MAE, Spearman rho, recall per level, confusion, their agreement; persona: per-rule precision
    and recall of the rule's failures, and accuracy). Any pass/fail grader, the LLM judge
    included (on rubrics/judge_labels.jsonl by default), against a labelled file or with
    --reviews against people's reviews in a ledger: Cohen's kappa with a 95 % interval and the
    confusion matrix, per rule. A plugin grader is found as `run` and `grade` find it: --grader-path,
    the workload folder it is run in, the graders the reviewed run recorded, entry points."""
    from ..grading import available
    from ..grading.base import hook
    from ..grading.registry import calibratable, resolve, use, workload_here

    use(paths=grader_paths, workload=workload_here())
    grader = resolve([grader])[0] if ":" in grader else grader
    choices = calibratable()
    if use_reviews or judge_endpoint or (grader not in choices and path is not None) or grader == "judge":
        from ..grading.calibrate_labels import agreement_lines, calibrate
        from ..spec.matrix import Judge

        if bool(judge_endpoint) != bool(judge_model):
            raise UsageError("--judge-endpoint and --judge-model go together (the judge's server and its model)")
        extra: dict[str, Any] = {"structured_output": judge_structured_output}
        if judge_max_tokens is not None:
            extra["max_tokens"] = judge_max_tokens
        judge = Judge(endpoint=judge_endpoint, model=judge_model, **extra) if judge_endpoint and judge_model else None
        db = command_ledger(ledger_path(ledger), create=False) if use_reviews else None
        if db is not None:  # the reviewed run's own graders (its workload's modules), as `grade` finds them
            use(db, run_id)
        r = calibrate(grader, path, db, run_id, judge)
        click.echo(json.dumps(r, indent=2) if as_json else "\n".join(agreement_lines(r)))
        return
    if grader not in choices:
        raise UsageError(f"--grader: '{grader}' has no calibration data (graders that have: {', '.join(choices)})")
    cls = available()[grader]
    r = hook(cls, "calibrate", path)
    click.echo(json.dumps(r, indent=2) if as_json else "\n".join(hook(cls, "calibration_lines", r)))


@cli.group(cls=Group)
def rubrics() -> None:
    """Check rubric and schema files."""


@rubrics.command("validate")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="rubrics directory [default: rubrics/]")
def rubrics_validate(directory: Path | None) -> None:
    """Load every registered grader's rubric files, reporting the first error (file:line, field)."""
    from ..grading import available
    from ..grading.base import hook

    d = directory or rubrics_dir()
    parts = [x for cls in available().values() if (x := hook(cls, "validate_rubrics", d))]
    click.echo(f"{d}: OK — " + "; ".join(parts))
