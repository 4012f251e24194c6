"""A ledger held open across a whole module while other processes read, copy, grade and report on
it (issue 45): the failure mode the issue reproduced 2 of 2 — a byte copy dropped this process's
locks, a child then believed it was the last connection, checkpointed and unlinked the -wal under
live connections, and the file became "not a database". Each test leaves the file to the next;
the last checks it from another process, and the session's check does again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkit.ledger import Ledger, copy_ledger, open_ledger
from evalkit.ledger.opening import integrity
from evalkit.paths import PROJECT_DIR
from evalkit.testing.stub_server import StubConfig, StubServer

from .ledger_integrity import expect_rows

pytestmark = pytest.mark.integration
CLI = [sys.executable, str(PROJECT_DIR / "cli.py")]
EXTRA = 250  # rows this module writes through the held connection, beside the run's


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Ledger, Path, dict[str, int]]]:
    folder = tmp_path_factory.mktemp("held")
    path = folder / "held.db"
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0)) as a, StubServer(StubConfig(ttft_ms=4, itl_ms=0)) as b:
        m = folder / "matrix.yaml"
        m.write_text(f"name: held\nbaseline: base\ngeneration:\n  warmup: 0\n  max_tokens: 16\nvariants:\n"
                     f"  - name: base\n    endpoint: {a.base_url}\n  - name: cand\n    endpoint: {b.base_url}\n")
        r = subprocess.run([*CLI, "run", "--matrix", str(m), "--limit", "6", "--ledger", str(path), "-q", "--no-grade"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    led = open_ledger(path, create=False)  # held open by this process from here to the module's end
    led._db.execute("pragma wal_autocheckpoint=0")  # this process never folds the -wal in: only others could
    state = {"requests": led._db.execute("select count(*) from requests").fetchone()[0]}
    yield led, path, state
    led.close()
    expect_rows(path, "requests", state["requests"])


def write_through(led: Ledger, state: dict[str, int], n: int) -> None:
    run_id = led.latest_run_id()
    seq = led.max_seq(run_id)
    led.insert_requests([{"run_id": run_id, "variant": "extra", "case_id": f"x{seq + i}", "repeat": 0, "final": 1,
                          "is_warmup": 1, "seq": seq + i + 1} for i in range(n)])  # warm-ups: no report reads them
    state["requests"] += n


@pytest.mark.parametrize("command", [["report", "--json"], ["check", "--max-error-rate", "1"],
                                     ["grade", "--grader", "schema"], ["ledger", "check"]])
def test_another_process_works_on_the_held_ledger(held, command):
    led, path, state = held
    write_through(led, state, EXTRA // 5)
    r = subprocess.run([*CLI, *command, "--ledger", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]


def test_a_copy_of_the_held_ledger_has_every_row(held, tmp_path):
    led, path, state = held
    write_through(led, state, EXTRA // 5)
    copy = copy_ledger(path, tmp_path / "copy.db")
    with open_ledger(copy, read_only=True) as c:
        assert c.max_seq(c.latest_run_id()) == led.max_seq(led.latest_run_id())


def test_the_held_connection_still_writes_and_reads_its_rows(held):
    led, path, state = held
    write_through(led, state, 10)
    assert led._db.execute("select count(*) from requests").fetchone()[0] == state["requests"]


def test_the_held_ledger_passes_another_processes_integrity_check(held):
    _, path, _ = held
    r = subprocess.run([*CLI, "ledger", "check", "--ledger", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_held_ledger_is_whole_read_from_here_too(held):
    _, path, _ = held
    assert integrity(path) == []
