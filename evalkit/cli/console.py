"""Presentation on a terminal or a log: the run's progress and the report's tables."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import click

# rich and the library load when used: `evalkit --help` imports every command module
if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from ..execution.progress import ProgressLog
    from ..measure.client import RequestResult
    from ..reporting.document import Block
    from ..spec.dataset import Case


@cache
def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def say(text: str) -> None:
    from rich.markup import escape

    # escaped: a message's own brackets ("[queue] server queue grew") are text, not rich markup
    stderr_console().print(f"[dim]evalkit:[/dim] {escape(text)}", highlight=False)


class RichProgress:
    """A rich progress bar on a terminal; plain progress lines when output goes to a log."""

    def __init__(self, quiet: bool = False, interval_s: float = 15.0) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task: Any = None
        self.plain = not stderr_console().is_terminal
        self.interval_s = interval_s
        self.logs: dict[str, ProgressLog] = {}

    def say(self, text: str) -> None:
        if not self.quiet:
            say(text)

    def level_start(self, variant: str, total: int) -> None:
        if self.quiet:
            return
        if self.plain:
            from ..execution.progress import ProgressLog

            self.logs[variant.split(" ")[0]] = ProgressLog(variant, total, self.interval_s)
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=stderr_console(),
        )
        self.progress.start()
        self.task = self.progress.add_task(variant, total=total, errors=0)

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        log = self.logs.get(variant)
        if log is not None and not case.id.startswith("_warmup"):
            line = log.add(result)
            if line:
                click.echo(f"evalkit: {line}", err=True)
        if self.progress is not None:
            errors = self.progress.tasks[0].fields["errors"] + (0 if result.ok else 1)
            self.progress.update(self.task, advance=1, errors=errors)

    def level_end(self, variant: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def table(title: str, header: list[str], body: list[list[str]], keys: int = 2) -> Table:
    from rich.table import Table

    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < keys else "right")
    for row in body:
        t.add_row(*row)
    return t


def interactive() -> bool:
    from rich.console import Console

    return Console().is_terminal


def print_blocks(blocks: list[Block], markdown_out: bool | None = None) -> None:
    """The report's blocks: rich tables that fit the terminal (split where wider), or Markdown when
    the output is not a terminal (a pipe, a file, CI) or Markdown was asked for."""
    from rich.console import Console

    from ..reporting.document import Table as DocTable
    from ..reporting.document import markdown, split

    if markdown_out if markdown_out is not None else not interactive():
        click.echo(markdown(blocks), nl=False)
        return
    c = Console()
    width = min(c.width, 100) if c.width else 100
    for b in blocks:
        if isinstance(b, DocTable):
            for part in split(b, width):
                c.print(table(part.title, part.header, part.rows, part.keys))
        else:
            click.echo(b)


def print_report(report: dict[str, Any], fnd: dict[str, Any] | None = None, by: list[str] | None = None,
                 markdown_out: bool | None = None) -> None:
    from ..reporting.document import document

    print_blocks(document(report, fnd, by), markdown_out)


def print_closing(fnd: dict[str, Any], ledger: str) -> None:
    """What a run ends with: its verdict, and where to look further."""
    from ..reporting.document import verdict_blocks

    for line in verdict_blocks(fnd):
        click.echo(str(line))
    click.echo(f"next: evalkit report --ledger {ledger} --html report.html  |  evalkit browse --ledger {ledger}")
