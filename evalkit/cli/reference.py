"""The CLI reference (docs/cli.md), generated from the commands' own --help so it cannot drift:
`python -m evalkit.cli.reference > docs/cli.md`; a test checks the committed page is current."""

from __future__ import annotations

import click

from . import cli


def _walk(cmd: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            out += _walk(cmd.commands[name], [*path, name])
    return out


def render() -> str:
    parts = ["# CLI reference", "",
             "Generated from `evalkit --help` by `python -m evalkit.cli.reference > docs/cli.md`; "
             "`tests/test_docs.py` fails when this page and the commands disagree.", ""]
    for path, cmd in _walk(cli, ["evalkit"]):
        # the group's context settings (-h, --help) as a real invocation has them; click caches the
        # help option per command, so help rendered without them would depend on what ran before
        settings = {**(cli.context_settings or {}), "terminal_width": 100, "max_content_width": 100}
        with click.Context(cmd, info_name=" ".join(path), **settings) as ctx:
            text = cmd.get_help(ctx)
        parts += [f"## {' '.join(path)}", "", "```", text.rstrip(), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
