"""Thin entry point: the same click group as the installed `evalkit` command."""

from evalkit.cli import cli

if __name__ == "__main__":
    cli()
