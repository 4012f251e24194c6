"""`evalkit dataset validate`, `matrix validate` and `prepare`: check and make ready what a run reads."""

from __future__ import annotations

from pathlib import Path

import click

from ..paths import default_dataset_path
from ..spec.dataset import dataset_summary, load_cases
from ..spec.matrix import load_matrix, matrix_summary
from .common import Group, cli
from .console import say


@cli.group(cls=Group)
def dataset() -> None:
    """Inspect and check benchmark datasets."""


@dataset.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
def dataset_validate(path: Path | None) -> None:
    """Check every row of a dataset (default: the shipped benchmark)."""
    click.echo(f"{path or default_dataset_path()}: {dataset_summary(load_cases(path))}")


@cli.group(cls=Group)
def matrix() -> None:
    """Inspect and check matrix files."""


@matrix.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
def matrix_validate(path: Path | None) -> None:
    """Check a matrix file, or a bundled matrix by name (default: the embedded default)."""
    click.echo(f"{path or 'default matrix'}: OK — {matrix_summary(load_matrix(path))}")


@cli.command()
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def prepare(matrix_path: Path | None) -> None:
    """Prepare the bundled models a matrix uses (done automatically by `run` on first use)."""
    from ..engines.bundled import prepare_matrix_models

    for name, path in prepare_matrix_models(load_matrix(matrix_path), say).items():
        click.echo(f"{name}: {path}")
