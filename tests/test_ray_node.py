"""A whole Ray node dies mid-run (its raylet killed): the ledger's process outlives the Ray driver
process the node took with it, records every variant on that node as `failed` with the cause,
leaves no process behind, and `--resume --ray` then sends every missing request once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.testing.stub_server import StubConfig, StubServer

pytest.importorskip("ray")
pytestmark = pytest.mark.integration  # a Ray node, a stub server and the CLI in a subprocess

EVALKIT = str(Path(sys.executable).with_name("evalkit"))


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(d))
    return out


def _descendants(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each run starts its own local Ray


def _ray_run(tmp: Path, a: StubServer, b: StubServer, until_sql: str | None = None,
             until_proc: str | None = None) -> tuple[subprocess.Popen[str], Path]:
    """`evalkit run --ray` of 40 cases against two stubs, returned once ``until_sql`` is true of its
    ledger, or once one of its processes' command lines holds ``until_proc``."""
    m = tmp / "m.yaml"
    m.write_text(f"name: raynode\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                 f"divergence: {{enabled: false}}\nvariants:\n  - name: base\n    endpoint: {a.base_url}\n"
                 f"  - name: cand\n    endpoint: {b.base_url}\n", encoding="utf-8")
    ledger = tmp / "l.db"
    p = subprocess.Popen([EVALKIT, "run", "--matrix", str(m), "--limit", "40", "--ledger", str(ledger), "-q", "--ray",
                          "--no-grade"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and p.poll() is None:
        if until_sql and ledger.exists() and _holds(ledger, until_sql):
            break
        if until_proc and any(until_proc in _cmdline(q) for q in _descendants(p.pid)):
            break
        time.sleep(0.1)
    return p, ledger


def _holds(ledger: Path, sql: str) -> bool:
    """``sql`` is true of the ledger; false while the run is still creating its tables."""
    try:
        return bool(Database(ledger).execute(sql).fetchone()[0])
    except sqlite3.OperationalError:  # the file exists before its migrations have made the tables
        return False


def _wait_gone(pids: list[int], limit_s: float = 20) -> None:
    """Until every pid has gone or ``limit_s`` passed (a reaped group takes a moment on a busy machine)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(_alive(q) for q in pids):
        time.sleep(0.5)


@pytest.fixture(scope="module")
def node_killed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("raynode")
    with StubServer(StubConfig(ttft_ms=100, itl_ms=20)) as a, StubServer(StubConfig(ttft_ms=100, itl_ms=20)) as b:
        # until rows stream in from both workers
        p, ledger = _ray_run(tmp, a, b, "select count(distinct variant) = 2 from requests")
        family = _descendants(p.pid)
        raylets = [q for q in family if "raylet/raylet" in _cmdline(q)]
        for q in raylets:
            os.kill(q, signal.SIGKILL)
        out = p.communicate(timeout=180)[0]
        _wait_gone(family)
        left = [f"{q} {_cmdline(q)[:120]}" for q in family if _alive(q)]
        db = Database(ledger)
        first = {"rc": p.returncode, "out": out, "raylets": raylets, "left": left,
                 "variants": {v["name"]: v for v in db["variants"].rows}, "run": next(db["runs"].rows),
                 "rows": db["requests"].count}
        r = subprocess.run([EVALKIT, "run", "--resume", first["run"]["id"], "--ledger", str(ledger), "-q", "--ray",
                            "--no-grade"], capture_output=True, text=True, env=ENV, timeout=300)
    db = Database(ledger)
    finals = Counter((x["variant"], x["case_id"], x["repeat"]) for x in db["requests"].rows_where("final = 1 and is_warmup = 0"))
    return {**first, "resume_rc": r.returncode, "resume_out": r.stdout + r.stderr, "finals": finals,
            "after": {v["name"]: (v["status"], v["error"]) for v in db["variants"].rows},
            "run_after": next(db["runs"].rows)["status"]}


def test_the_raylet_was_killed_mid_run(node_killed):
    assert node_killed["raylets"], node_killed["out"][-2000:]


def test_the_run_exits_1(node_killed):
    assert node_killed["rc"] == 1, node_killed["out"][-2000:]


def test_some_rows_streamed_before_the_node_died(node_killed):
    assert 0 < node_killed["rows"] < 80


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_each_variant_on_the_dead_node_is_failed(node_killed, variant):
    assert node_killed["variants"][variant]["status"] == "failed"


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_the_cause_names_the_node(node_killed, variant):
    assert "Ray node" in (node_killed["variants"][variant]["error"] or "")


def test_the_run_is_not_left_running(node_killed):
    assert node_killed["run"]["status"] == "failed"


def test_no_process_of_the_run_is_left(node_killed):
    assert node_killed["left"] == []


def test_the_resume_completes(node_killed):
    assert node_killed["resume_rc"] == 0, node_killed["resume_out"][-2000:]


def test_the_resume_sends_every_request_once(node_killed):
    assert sorted(node_killed["finals"].values()) == [1] * 80


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_the_resume_leaves_each_variant_complete_without_the_old_cause(node_killed, variant):
    assert node_killed["after"][variant] == ("complete", None)


def test_the_resumed_run_is_complete(node_killed):
    assert node_killed["run_after"] == "complete"


@pytest.mark.integration
@pytest.mark.parametrize("when", ["while Ray starts", "while sending"])
def test_a_killed_evalkit_leaves_no_ray_process(tmp_path, when):
    """SIGKILL to `evalkit run --ray`: its driver process dies with it and takes the Ray processes
    it started along (Ray's agents would otherwise run on as orphans), also while `ray.init`, whose
    own SIGTERM handler exits through a traceback, is still starting them."""
    with StubServer(StubConfig(ttft_ms=100, itl_ms=20)) as a, StubServer(StubConfig(ttft_ms=100, itl_ms=20)) as b:
        if when == "while sending":
            p, _ = _ray_run(tmp_path, a, b, until_sql="select count(*) > 0 from requests")
        else:
            p, _ = _ray_run(tmp_path, a, b, until_proc="dashboard/agent.py")
        family = _descendants(p.pid)
        p.kill()
        out = p.communicate()[0]
        _wait_gone(family)
    assert [f"{q} {_cmdline(q)[:80]}" for q in family if _alive(q)] == []
    assert "Traceback" not in out
