"""Verdicts the machine cannot bend (issue 47), as a user would meet it on a 2-core machine: two
CPU-bound endpoints on core 0, the candidate doing 30 % less work a token, evalkit on core 1,
and a neighbour spinning on the servers' core from the candidate's first measured request to
the end. Alternated, the neighbour slows both sides alike: the verdict never turns to "inferior"
and its estimate keeps its direction; one after the other, it is undecided, naming the machine's
load, never "inferior".
The ledger holds the foreign load it saw."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from evalkit.paths import PROJECT_DIR
from evalkit.reporting.machine import DEFAULT_THRESHOLDS

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("taskset") is None or (os.cpu_count() or 1) < 2,
                                 reason="needs taskset and two cores")]
EVALKIT = str(Path(sys.executable).with_name("evalkit"))
WARMUPS = 3  # warm-up 1 + the two timing probes, per variant
TOKEN_MS = 6.0  # the baseline's CPU time a token; the candidate does 30 % less work


def units_for(ms: float) -> int:
    """`--cpu-units` that take ``ms`` on this processor: each side must last several of the
    sampler's 1 s intervals whatever the processor (a side with fewer than
    MachineThresholds.min_samples samples says nothing about the machine)."""
    from evalkit.testing.cpu_burn import burn

    t0 = time.perf_counter()
    burn(20000)
    return max(1, round(ms / 1000.0 * 20000 / (time.perf_counter() - t0)))


@functools.cache
def units() -> dict[str, int]:
    base = units_for(TOKEN_MS)
    return {"base": base, "cand": round(base * 0.7)}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str) -> None:
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not start")


def requests_served(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as r:
        return int(json.loads(r.read())["requests"])


def run(tmp: Path, order: str, neighbour: bool) -> tuple[dict, Path]:
    """One evalkit run on core 1 against the two stubs on core 0; returns the report JSON."""
    ports = {v: free_port() for v in units()}
    stubs = [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "evalkit.testing.stub_server", "--port",
                               str(p), "--ttft-ms", "1", "--itl-ms", "0", "--fixed-chunks", "24", "--cpu-units",
                               str(units()[v])], cwd=PROJECT_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for v, p in ports.items()]
    spinner: list[subprocess.Popen] = []
    done = threading.Event()
    try:
        urls = {v: f"http://127.0.0.1:{p}" for v, p in ports.items()}
        for u in urls.values():
            wait_up(u)
        m = tmp / "m.yaml"
        m.write_text("name: cpu\nbaseline: base\nmargins: {e2e_mean: +5%}\ngeneration:\n  warmup: 1\n  max_tokens: 64\n"
                     "  structured_output: false\n  baseline_repeats: 2\nvariants:\n"
                     + "".join(f"  - name: {v}\n    endpoint: {u}\n" for v, u in urls.items()))

        def start_neighbour() -> None:  # from the candidate's first measured request to the end
            while not done.is_set() and requests_served(urls["cand"]) <= WARMUPS:
                time.sleep(0.01)
            if not done.is_set():
                spinner.append(subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"],
                                                start_new_session=True))

        watcher = threading.Thread(target=start_neighbour, daemon=True)
        if neighbour:
            watcher.start()
        ledger = tmp / "l.db"
        r = subprocess.run(["taskset", "-c", "1", EVALKIT, "run", "--matrix", str(m), "--limit", "24", "--order", order,
                            "--ledger", str(ledger), "--no-grade", "-q"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        done.set()
        for p in spinner + stubs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    rep = subprocess.run([EVALKIT, "report", "--ledger", str(ledger), "--json"], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-2000:]
    return json.loads(rep.stdout), ledger


def e2e_verdict(rep: dict) -> dict:
    return next(v for v in rep["findings"]["verdicts"] if v["metric"] == "e2e_mean")


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    return run(tmp_path_factory.mktemp("quiet"), "alternate", neighbour=False)


@pytest.fixture(scope="module")
def alternated(tmp_path_factory):
    return run(tmp_path_factory.mktemp("alt"), "alternate", neighbour=True)


@pytest.fixture(scope="module")
def back_to_back(tmp_path_factory):
    return run(tmp_path_factory.mktemp("seq"), "sequential", neighbour=True)


def test_quiet_the_candidate_is_superior(quiet):
    assert e2e_verdict(quiet[0])["verdict"] == "superior", e2e_verdict(quiet[0])


def test_alternated_the_neighbour_never_reverses_the_verdict(alternated):
    assert e2e_verdict(alternated[0])["verdict"] != "inferior", e2e_verdict(alternated[0])


def test_alternated_the_neighbour_keeps_the_direction_of_the_difference(alternated):
    # the spinner slows both sides alike: the candidate still reads faster (a busy machine may widen
    # the interval to inconclusive, but never turns the estimate around)
    assert e2e_verdict(alternated[0])["estimate"] < 0, e2e_verdict(alternated[0])


def test_back_to_back_the_neighbour_never_makes_it_inferior(back_to_back):
    assert e2e_verdict(back_to_back[0])["verdict"] != "inferior", e2e_verdict(back_to_back[0])


def test_back_to_back_under_the_neighbour_is_undecided(back_to_back):
    assert e2e_verdict(back_to_back[0])["verdict"] == "undecided", e2e_verdict(back_to_back[0])


def test_the_undecided_verdict_names_the_foreign_cpu(back_to_back):
    assert "foreign CPU" in e2e_verdict(back_to_back[0])["why"]


@pytest.mark.parametrize("variant", ["base", "cand"])
def test_each_side_lasted_long_enough_to_be_sampled(back_to_back, variant):
    load = {e["variant"]: e for e in back_to_back[0]["findings"]["timeshare"]["env_load"]}
    assert load[variant]["samples"] >= DEFAULT_THRESHOLDS.min_samples, load[variant]


def test_the_ledger_holds_the_foreign_load_the_candidate_ran_under(back_to_back):
    rep, ledger = back_to_back
    load = {e["variant"]: e for e in rep["findings"]["timeshare"]["env_load"]}
    # the spinner shares core 0 with the candidate's server: about half a core, above the 0.25 bar
    assert load["cand"]["foreign_cpu_mean"] - load["base"]["foreign_cpu_mean"] >= DEFAULT_THRESHOLDS.foreign_cpu_cores, load


def test_the_samples_are_in_the_ledger(back_to_back):
    with sqlite3.connect(back_to_back[1]) as c:
        assert c.execute("select count(*) from env_samples").fetchone()[0] >= 3


def test_an_alternated_run_prints_its_a_a_control(alternated):
    assert any(x.startswith("A/A e2e_mean") for x in alternated[0]["findings"]["timeshare"]["headline"])
