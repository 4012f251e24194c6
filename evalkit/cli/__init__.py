"""The evalkit command line: parse, call the library, print. One module per command group; the
logic of every command lives in the library and is callable (and tested) from Python.

May import: anything in evalkit. Nothing imports it but the entry points.
"""

from __future__ import annotations

from . import grade, inputs, ledger, models, results, run, share  # noqa: F401  (each registers its commands)
from .common import cli


def main() -> None:
    cli()


__all__ = ["cli", "main"]
