"""The click group, the error mapping and the options several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import __version__
from ..errors import EvalkitError
from ..paths import default_ledger_path

if TYPE_CHECKING:
    from ..ledger import Ledger


class EvalkitClickError(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Group(click.Group):
    """Turns library errors into one-line click errors with the library's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EvalkitError as e:
            raise EvalkitClickError(str(e).splitlines()[0], e.exit_code) from None
        except click.UsageError as e:
            # one line, no usage banner: bad flags read like every other bad input
            if isinstance(e, click.NoSuchOption | click.BadParameter | click.MissingParameter | click.BadOptionUsage):
                raise EvalkitClickError(e.format_message().replace("\n", " "), 2) from None
            raise


LEDGER_OPT = click.option(
    "--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="SQLite ledger file [default: $EVALKIT_LEDGER or ./evalkit.db]",
)
RUN_OPT = click.option("--run", "run_id", default=None, help="run id [default: the latest run]")


def ledger_path(p: Path | None) -> Path:
    return p or default_ledger_path()


def command_ledger(path: Path, **kw: Any) -> Ledger:
    """`open_ledger` for a command: closed when the command ends, whatever happens (click closes
    its context's resources), so no command leaves a connection to the garbage collector."""
    from ..ledger import open_ledger

    return click.get_current_context().with_resource(open_ledger(path, **kw))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="evalkit")
def cli() -> None:
    """evalkit: run the same real workload through several model variants served by vLLM,
    measure every request, grade every output, and keep it all in one SQLite ledger.

    \b
    Quick start (real vLLM on CPU, bundled SmolLM2, unquantized vs W8A8):
      evalkit run --time-budget 10m   # as many cases as fit 10 min here: serve, send, write evalkit.db
      evalkit report              # per variant x complexity: TTFT, E2E, quality, verdicts
    """
