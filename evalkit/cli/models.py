"""`evalkit models`: the bundled models a matrix can launch by name (`model: bundled:NAME`)."""

from __future__ import annotations

import json

import click

from .common import cli


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="print them as JSON")
def models(as_json: bool) -> None:
    """The bundled models a matrix's variant can launch with `model: bundled:NAME` (made on first use
    by `evalkit prepare` or `run`), what each is, and whether this machine has it prepared. Any
    other `model:` is passed to vLLM as it is (a Hugging Face id or a checkpoint folder)."""
    from ..engines.bundled import catalog

    rows = catalog()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for m in rows:
        click.echo(f"{m['model']}: {m['description']} ({'prepared: ' + m['path'] if m['prepared'] else 'not prepared'})")
