"""`evalkit dataset validate`, `matrix validate` and `prepare`: check and make ready what a run reads."""

from __future__ import annotations

from pathlib import Path

import click

from ..paths import default_dataset_path
from .common import Group, cli
from .console import say


@cli.group(cls=Group)
def dataset() -> None:
    """Inspect and check benchmark datasets."""


@dataset.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--workload", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="a workload folder: its dataset, schemas/ and graders")
def dataset_validate(path: Path | None, workload: Path | None) -> None:
    """Check every row of a dataset (default: the workload's, else the shipped benchmark) and say
    which graders its cases can feed."""
    from ..grading.registry import choose, use_workload
    from ..spec.dataset import dataset_summary, load_cases
    from ..spec.matrix import load_matrix

    m = load_matrix(workload) if workload is not None else None
    p = path or (m.workload_path("dataset", "dataset.jsonl") if m else None) or default_dataset_path()
    cases = m.load_cases(p) if m else load_cases(p)
    if m is not None:
        use_workload(m.folder)
    names, notes = choose(m.graders if m else None, cases, with_judge=bool(m and m.judge), where=str(p))
    click.echo(f"{p}: {dataset_summary(cases)}; graders: {', '.join(names) or 'none'}")
    for note in notes:
        click.echo(note)


@cli.group(cls=Group)
def matrix() -> None:
    """Inspect and check matrix files."""


@matrix.command("validate")
@click.argument("path", type=click.Path(path_type=Path), required=False)
def matrix_validate(path: Path | None) -> None:
    """Check a matrix file, a workload folder's, or a bundled matrix by name (default: the embedded
    default): its fields, and its margins as `run` checks them (its graders' too)."""
    from ..grading.margins import matrix_margins
    from ..spec.matrix import load_matrix, matrix_summary

    m = load_matrix(path)
    matrix_margins(m)  # the check `run` makes before sending: a misspelled metric stops here too
    click.echo(f"{path or 'default matrix'}: OK — {matrix_summary(m)}")


@matrix.command("show")
@click.argument("name", metavar="[NAME|FILE]", type=click.Path(path_type=Path), required=False)
def matrix_show(name: Path | None) -> None:
    """Print a matrix's YAML as shipped: a bundled one by name (default, capacity, saturation,
    drift-control; default: the embedded default), a file, or a workload folder's matrix.yaml."""
    from ..errors import MatrixError
    from ..spec.matrix import bundled_matrices, matrix_file

    p = matrix_file(name)
    if not p.is_file():
        raise MatrixError(f"{name}: not a matrix file, a workload folder or a bundled matrix "
                          f"({', '.join(bundled_matrices())})")
    click.echo(p.read_text(encoding="utf-8"), nl=False)


@cli.command()
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def prepare(matrix_path: Path | None) -> None:
    """Prepare the bundled models a matrix uses (done automatically by `run` on first use)."""
    from ..engines.bundled import prepare_matrix_models
    from ..spec.matrix import load_matrix

    for name, path in prepare_matrix_models(load_matrix(matrix_path), say).items():
        click.echo(f"{name}: {path}")


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def init(folder: Path) -> None:
    """Scaffold a workload of your own in FOLDER: cases, a schema, a matrix with two endpoints and
    a grader stub, ready to run (docs/workloads.md)."""
    from ..spec.workload import scaffold

    for p in scaffold(folder):
        click.echo(f"wrote {p}")
    click.echo(f"next: start two servers (or `evalkit stub --port 8101 &` and `evalkit stub --port 8102 &`), then "
               f"`evalkit run --workload {folder}`")


@cli.command()
@click.option("--port", type=click.IntRange(1, 65535), default=8101, show_default=True)
@click.option("--ttft-ms", type=click.FloatRange(min=0), default=20.0, show_default=True)
@click.option("--itl-ms", type=click.FloatRange(min=0), default=2.0, show_default=True)
def stub(port: int, ttft_ms: float, itl_ms: float) -> None:
    """Serve evalkit's stub OpenAI-compatible endpoint on 127.0.0.1 (deterministic streamed answers
    that follow a request's JSON Schema): a server to try a workload against before your own."""
    from aiohttp import web

    from ..testing.stub_server import StubConfig, make_app

    say(f"stub endpoint on http://127.0.0.1:{port} (Ctrl-C stops it)")
    web.run_app(make_app(StubConfig(ttft_ms=ttft_ms, itl_ms=itl_ms)), host="127.0.0.1", port=port, access_log=None,
                print=None)
