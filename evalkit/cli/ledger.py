"""`evalkit ledger merge|path`: where the ledger is; ledgers made apart, merged."""

from __future__ import annotations

from pathlib import Path

import click

from .common import LEDGER_OPT, Group, cli, ledger_path


@cli.group(cls=Group)
def ledger() -> None:
    """Where the ledger is; merging ledgers."""


@ledger.command("merge")
@click.argument("sources", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the merged ledger to write (must not exist)")
def ledger_merge(sources: tuple[Path, ...], out: Path) -> None:
    """Merge ledgers made apart: migrations aligned, run ids kept, a run resumed in two places
    de-duplicated by (variant, case, repeat, level); reviews follow the answers they read, one row
    per submission."""
    from ..ledger.merge import merge_ledgers

    counts = merge_ledgers(list(sources), out)
    click.echo(f"wrote {out}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()))


@ledger.command("path")
@LEDGER_OPT
def ledger_path_cmd(ledger: Path | None) -> None:
    """Print the ledger path (for `datasette "$(evalkit ledger path)"`)."""
    click.echo(str(ledger_path(ledger).resolve()))
