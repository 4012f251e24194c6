"""The chaos soak, short: benchmarks/soak.py for 45 s of random faults (a stub server killed and
started again, SIGTERM and SIGKILL to `evalkit run`, a ledger that cannot grow), every run then
finished; what held is checked one fact at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("soak")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--duration", "45", "--seed", "3",
                        "--fault-every", "4", "--work", str(work), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.stdout.strip(), p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fact", ["every request once", "statuses true at each exit", "runs and variants complete",
                                  "no process left", "report builds"])
def test_what_the_soak_checks_held(soak, fact):
    assert soak["held"][fact], json.dumps({k: soak[k] for k in ("runs", "exits", "left")})[-3000:]


@pytest.mark.parametrize("fault", ["kill_server", "sigterm_evalkit", "sigkill_evalkit", "disk_full"])
def test_each_kind_of_fault_landed(soak, fault):
    assert soak["faults"][fault] >= 1


def test_the_soak_names_the_processor(soak):
    assert "cores" in soak["host"]
