"""Kills at random moments of every command that writes a ledger or a file made from one (issue
45): benchmarks/kill_points.py, two kills a command; what held is checked one fact at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("merge", "grade", "migrate", "publish", "report", "copy")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kills(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("kills")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kill_points.py"), "--kills", "2", "--seed", "5",
                        "--work", str(work), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.stdout.strip(), p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fact", ["every command runs unkilled", "no damaged file after a kill",
                                  "nothing half-written under a final name", "a rerun completes",
                                  "no damaged file after the rerun"])
def test_what_the_kills_check_held(kills, fact):
    broke = [r for r in kills["results"] if r.get("error") or r["damaged"] or r["half_written"] or r.get("rerun_error")]
    assert kills["held"][fact], json.dumps(broke)[-3000:]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_kill_landed_inside_each_command(kills, command):
    assert kills["landed"][command] >= 1
