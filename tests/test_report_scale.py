"""Reports at any size and a command line that starts at once (issue 37): the help loads none of
the heavy libraries, the synthesized ledger is a ledger the report reads, and the streamed
numbers equal the ones computed from every row in memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("scipy", "numpy", "sqlite_utils", "aiohttp", "datasets", "torch", "sentence_transformers", "jsonschema",
         "pydantic")

_PROBE = ("import sys\nfrom click.testing import CliRunner\nfrom evalkit.cli import cli\n"
          "for args in (['--help'], ['report', '--help'], ['run', '--help']):\n"
          "    assert CliRunner().invoke(cli, args).exit_code == 0, args\n"
          f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n")


@pytest.mark.integration
def test_the_help_loads_no_heavy_library():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
