"""`evalkit ledger merge|copy|migrate|check|path`: ledgers made apart, merged; a safe copy; the
schema brought up to date; an integrity check; where the ledger is."""

from __future__ import annotations

from pathlib import Path

import click

from .common import LEDGER_OPT, EvalkitClickError, Group, cli, command_ledger, ledger_path


@cli.group(cls=Group)
def ledger() -> None:
    """Where the ledger is; merging, copying, migrating and checking ledgers."""


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


@ledger.command("copy")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def ledger_copy(source: Path, dest: Path) -> None:
    """Copy a ledger, even one being written, through SQLite's backup API (never `cp`: a byte copy
    of a live ledger misses the rows still in its -wal, and closing the copy's file drops the
    locks that keep other processes from unlinking that -wal). DEST must not exist."""
    from ..ledger import copy_ledger

    copy_ledger(source, dest)
    click.echo(f"copied {source} -> {dest}")


@ledger.command("migrate")
@LEDGER_OPT
def ledger_migrate(ledger: Path | None) -> None:
    """Bring a ledger to this evalkit's schema in place (every command that writes does so on open;
    each migration is one transaction, so a kill leaves it at a whole step and a rerun goes on)."""
    from ..ledger.opening import applied_migrations

    path = ledger_path(ledger)
    before = applied_migrations(path)
    after = len(command_ledger(path, create=False).migrations_applied())
    click.echo(f"{path}: {after - before} migration(s) applied, {after} in all")


@ledger.command("check")
@LEDGER_OPT
def ledger_check(ledger: Path | None) -> None:
    """SQLite's integrity check on a ledger, read-only; exit 1 when it finds damage."""
    from ..ledger.opening import integrity

    path = ledger_path(ledger)
    problems = integrity(path)
    if problems:
        raise EvalkitClickError(f"{path}: damaged: {'; '.join(problems[:5])}", 1)
    click.echo(f"{path}: ok")


@ledger.command("path")
@LEDGER_OPT
def ledger_path_cmd(ledger: Path | None) -> None:
    """Print the ledger path (for `datasette "$(evalkit ledger path)"`)."""
    click.echo(str(ledger_path(ledger).resolve()))
