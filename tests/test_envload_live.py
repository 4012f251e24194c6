"""The load sampler on this machine's real /proc (issue 47): spinning processes that are neither
evalkit nor a server read as foreign CPU, and the same processes named as a server's PIDs read as
server CPU. Other engineers share this 2-core machine and may keep it saturated: the decisive
checks compare two samplers over the same seconds (spinners unknown vs known), whose difference
is the spinners' own CPU whatever the rest of the machine does."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

from evalkit.ledger import open_ledger
from evalkit.measure.envload import EnvSampler
from evalkit.measure.gpuload import GpuReader
from evalkit.measure.procfs import ProcFS

# Started through a parent that exits at once: the spinner is then no descendant of this process
# (not evalkit's), as a neighbour would be.
SPAWN = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], "
         "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "print(p.pid)")


def spawn_spinner() -> int:
    out = subprocess.run([sys.executable, "-c", SPAWN], capture_output=True, text=True, timeout=30, check=True)
    return int(out.stdout.strip())


def cpu_ticks(pids: list[int]) -> int:
    procs = ProcFS().processes()
    return sum(procs[p].utime + procs[p].stime for p in pids if p in procs)


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows if r[key] is not None)


@pytest.mark.integration
def test_spinning_neighbours_read_as_foreign_cpu(ledger_path):
    ledger = open_ledger(ledger_path)
    spinners: list[int] = []

    def sampler(run_id: str, known: dict[str, list[int]]) -> EnvSampler:
        return EnvSampler(ledger, run_id, epoch=time.perf_counter(), known_pids=lambda: known, interval_s=0.5,
                          flush_every_s=1.0, gpu=GpuReader(object()))

    try:
        quiet = sampler("quiet", {})
        quiet.start()
        time.sleep(1.2)
        quiet.stop()
        spinners = [spawn_spinner(), spawn_spinner()]
        time.sleep(0.3)
        unknown, known = sampler("unknown", {}), sampler("known", {"srv": spinners})
        t0, ticks0 = time.perf_counter(), cpu_ticks(spinners)
        both = [threading.Thread(target=s.start) for s in (unknown, known)]
        for t in both:
            t.start()
        time.sleep(2.5)
        unknown.stop()
        known.stop()
        spun = (cpu_ticks(spinners) - ticks0) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t0)
        q, a, b = (ledger.env_samples(r) for r in ("quiet", "unknown", "known"))
    finally:
        for pid in spinners:
            os.kill(pid, signal.SIGKILL)
        ledger.close()
    seen = {k: round(mean(rows, m), 2) for k, rows, m in (("quiet", q, "foreign_cpu"), ("unknown", a, "foreign_cpu"),
                                                           ("known", b, "foreign_cpu"), ("server", b, "server_cpu"),
                                                           ("own", b, "own_cpu"), ("quiet_busy", q, "busy_cpu"))}
    seen["spun"] = round(spun, 2)
    assert min(len(q), len(a), len(b)) >= 2
    assert seen["unknown"] >= 0.5, seen
    assert seen["unknown"] - seen["known"] >= 0.5, seen  # the spinners' CPU, counted foreign only when unknown
    assert seen["server"] >= 0.5, seen
    assert seen["server"] == pytest.approx(spun, abs=0.3), seen  # what their own /proc/<pid>/stat says
    assert seen["own"] < 0.5, seen
    if seen["quiet_busy"] <= (os.cpu_count() or 1) - 1.5:  # room on the machine: the spinners add to its foreign load
        assert seen["unknown"] - seen["quiet"] >= 0.5, seen
    assert all(r["load1"] is not None and r["mem_available_mb"] for r in a)
