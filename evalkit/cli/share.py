"""`evalkit browse` and `publish`: the ledger in Datasette, a run as a Hugging Face dataset."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import UsageError
from .common import LEDGER_OPT, RUN_OPT, cli, command_ledger, ledger_path
from .console import say
from .grade import GRADER_PATH_OPT, use_graders


@cli.command()
@LEDGER_OPT
@click.option("--host", default="127.0.0.1", show_default=True, help="bind address (anything else exposes the ledger)")
@click.option("--port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@GRADER_PATH_OPT
@click.option("--review", is_flag=True, help="let the comparison pages (/-/compare) store reviews of each pair "
              "[default: read-only]")
@click.option("--reviewer", default=None, metavar="NAME", help="who is reviewing (needed with --review)")
def browse(ledger: Path | None, host: str, port: int, grader_paths: tuple[Path, ...], review: bool,
           reviewer: str | None) -> None:
    """Datasette on the ledger with titles, column descriptions, facets, canned queries (the
    study's summary, spikes, capacity, verdicts, each grader's own) and readable generated text;
    /-/compare shows each candidate's answers beside the baseline's (flips first, then KL, then
    drift; tokens shaded by KL) and, with --review, stores a reviewer's verdict on each pair.
    SIGTERM, SIGHUP and Ctrl-C stop Datasette with it."""
    from ..execution.signals import Interrupted
    from ..sharing.browse import browse as serve
    from ..sharing.browse import refresh_derived

    if review and not (reviewer or "").strip():
        raise UsageError("--review needs --reviewer NAME (each review says who made it)")
    if reviewer and not review:
        raise UsageError("--reviewer goes with --review (browsing is read-only without it)")
    path = ledger_path(ledger)
    db = command_ledger(path, create=False)
    use_graders(db, None, grader_paths, every_run=True)
    refresh_derived(db, say)  # what could fail fails before the address is printed
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"[yellow]serving on {host}: anyone who can reach it can read the ledger[/yellow]")
    click.echo(f"Datasette on http://{host}:{port}/ (Ctrl-C stops it); compare answers: http://{host}:{port}/-/compare"
               + (f" (reviewing as {reviewer.strip()})" if review and reviewer else ""))
    try:
        serve(db, path, host, port, say=say, reviewer=reviewer.strip() if review and reviewer else None)
    except Interrupted as e:  # asked to stop: not an error, but the signal's exit code
        say(str(e))
        click.get_current_context().exit(e.exit_code)


@cli.command()
@LEDGER_OPT
@RUN_OPT
@click.option("--repo", default=None, help="OWNER/NAME of the Hugging Face dataset to push to")
@click.option("--private", is_flag=True, help="create the dataset repo as private")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write the parquet files and dataset card here instead of (or before) pushing")
@GRADER_PATH_OPT
def publish(ledger: Path | None, run_id: str | None, repo: str | None, private: bool, out_dir: Path | None,
            grader_paths: tuple[Path, ...]) -> None:
    """Publish a run as a Hugging Face dataset: configs for requests, grades, server series,
    summary (parquet) and a dataset card with config, definitions and the summary table. The
    token comes from $HF_TOKEN only; anything that looks like a secret stops the publish."""
    import tempfile

    from ..sharing.publish import export, push

    if not repo and not out_dir:
        raise UsageError("give --repo OWNER/NAME to push, or --out DIR to write the files locally")
    db = command_ledger(ledger_path(ledger), create=False)
    use_graders(db, run_id, grader_paths)
    target = out_dir or Path(tempfile.mkdtemp(prefix="evalkit-publish-")) / "dataset"
    counts = export(db, target, run_id)
    click.echo(f"wrote {target}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if repo:
        click.echo(f"pushed to {push(target, repo, private)}")


@cli.command("import")
@LEDGER_OPT
@click.argument("tool", type=click.Choice(["guidellm", "aiperf", "vllm-bench"]))
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--into", "into", default=None, metavar="RUN_ID",
              help="add the requests as a variant of this run (side by side with its own) [default: a new run]")
@click.option("--as", "name", default=None, help="the variant's name [default: TOOL:MODEL]")
def import_cmd(ledger: Path | None, tool: str, path: Path, into: str | None, name: str | None) -> None:
    """Read another load tool's per-request results into the ledger: GuideLLM's benchmark JSON,
    AIPerf's profile_export.jsonl, or `vllm bench serve --save-result --save-detailed`. Each
    tool's definitions are mapped onto evalkit's; fields it does not record stay empty."""
    from ..sharing.importers import import_results

    db = command_ledger(ledger_path(ledger), create=into is None)
    rid = import_results(db, tool, path, into, name)
    click.echo(f"imported {path} ({tool}) into run {rid}")
