"""Load modes do what their names say: open-loop arrivals at R/s whatever the server does, a
cap that is measured when it holds requests back, and sweeps that stop at real pressure."""

from __future__ import annotations

import json
import statistics

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.execution.load import load_from_options
from evalkit.execution.patterns import OpenLoop, arrival_offsets
from evalkit.testing.stub_server import StubConfig, StubServer


def _gaps(xs: list[float]) -> list[float]:
    return [b - a for a, b in zip(xs, xs[1:], strict=False)]


def test_poisson_schedule_is_seeded_and_has_the_right_shape():
    offsets = arrival_offsets(600, 20.0, "poisson", arrival_seed=7)
    gaps = _gaps(offsets)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 20, rel=0.05)  # mean gap within 5 % of 1/R
    assert 0.85 <= statistics.pstdev(gaps) / mean <= 1.15  # exponential gaps: CV about 1
    assert arrival_offsets(600, 20.0, "poisson", arrival_seed=7) == offsets  # the same seed, the same schedule
    assert arrival_offsets(600, 20.0, "poisson", arrival_seed=8) != offsets
    constant = _gaps(arrival_offsets(10, 4.0, "constant", arrival_seed=0))
    assert constant == pytest.approx([0.25] * 9)


def _open_loop_run(runner, endpoint_matrix, ledger_path, stub: StubServer, *args: str) -> list[dict]:
    m = endpoint_matrix(stub.base_url, structured=False, warmup=0)
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--ledger", str(ledger_path), "-q", "--no-grade",
                            "--limit", "10", "--repeats", "3", *args])
    assert r.exit_code == 0, r.output
    return list(Database(ledger_path).query("select * from requests where is_warmup = 0 order by scheduled_ms"))


@pytest.mark.integration
def test_rate_is_open_loop_requests_overlap_with_a_slow_server(runner, endpoint_matrix, ledger_path):
    # TTFT 200 ms at 20 req/s: a closed loop of one would send 5/s; an open loop keeps 20/s and overlaps.
    with StubServer(StubConfig(ttft_ms=200, itl_ms=1, max_chunks=4)) as s:
        rows = _open_loop_run(runner, endpoint_matrix, ledger_path, s, "--rate", "20", "--arrival-seed", "3")
    assert len(rows) == 30
    assert all(r["error_class"] is None for r in rows)
    expected = [x * 1000 for x in arrival_offsets(30, 20.0, "poisson", arrival_seed=3)]
    got = [r["scheduled_ms"] - rows[0]["scheduled_ms"] for r in rows]
    assert got == pytest.approx(expected, abs=0.01)  # the stored schedule is the seeded one
    lag = [r["sent_ms"] - r["scheduled_ms"] for r in rows]
    assert max(lag) < 150  # on time, whatever the server did (a closed loop falls ~150 ms behind per request)
    spans = [(r["sent_ms"], r["sent_ms"] + r["e2e_ms"]) for r in rows]
    overlaps = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert overlaps > 1  # requests really were in flight together
    assert all(r["client_wait_ms"] is not None and r["ttft_from_schedule_ms"] >= r["ttft_ms"] for r in rows)
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(ledger_path)]).output)
    (arr,) = rep["arrivals"]
    assert arr["requested_rps"] == 20
    assert arr["max_concurrency"] is None
    assert arr["max_in_flight"] > 1
    assert arr["warning"] is None
    out = runner.invoke(cli, ["report", "--ledger", str(ledger_path)]).output
    assert "poisson at 20/s requested" in out
    assert "(uncapped)" in out


@pytest.mark.integration
def test_max_concurrency_caps_in_flight_and_records_the_wait(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=200, itl_ms=1, max_chunks=4)) as s:
        rows = _open_loop_run(runner, endpoint_matrix, ledger_path, s, "--rate", "20", "--max-concurrency", "2")
    spans = [(r["sent_ms"], r["sent_ms"] + r["e2e_ms"]) for r in rows]
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) <= 2
    assert max(r["client_wait_ms"] for r in rows) > 100  # the cap held requests back, and it shows
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(ledger_path)]).output)
    (arr,) = rep["arrivals"]
    assert arr["max_in_flight"] == 2
    assert arr["warning"]
    assert "fell behind" in arr["warning"]
    row = next(x for x in rep["rows"] if x["complexity"] == "all")
    assert row["ttft_sched_p99_ms"] > row["ttft_p99_ms"] + 100
    assert row["client_wait_p99_ms"] > 100


@pytest.mark.parametrize("args, expected", [
    (["--rate", "2", "--concurrency", "4"], "--max-concurrency"),
    (["--max-concurrency", "2"], "--rate"),
    (["--arrival", "constant"], "--rate"),
    (["--rate", "2", "--max-concurrency", "0"], "--max-concurrency"),
])
@pytest.mark.integration
def test_open_loop_flags_that_contradict_exit_2(runner, args, expected, tmp_path):
    r = runner.invoke(cli, ["run", "--ledger", str(tmp_path / "l.db"), *args])
    assert r.exit_code == 2, r.output
    assert expected in r.output, r.output
    assert "Traceback" not in r.output, r.output
    assert not (tmp_path / "l.db").exists()


def test_load_rules_live_in_the_library():
    with pytest.raises(Exception, match="max-concurrency"):
        load_from_options(None, rate=2, concurrency=4)


def test_options_become_one_typed_pattern():
    load = load_from_options(None, rate=2.5, arrival="constant", max_concurrency=3)
    assert load.pattern == OpenLoop(2.5, "constant", 3, 0)


def _sweep(runner, endpoint_matrix, ledger_path, cfg: StubConfig, *args: str):
    with StubServer(cfg) as s:
        m = endpoint_matrix(s.base_url, structured=False, extra="telemetry:\n  interval_s: 0.02\n")
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--ledger", str(ledger_path), "--no-grade",
                                "--limit", "8", "--sweep", "1,2,4,8", *args])
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.integration
def test_sweep_stops_when_kv_cache_fills(runner, endpoint_matrix, ledger_path):
    # each running request holds 20 % of the cache: 1 -> 20 %, 2 -> 40 %, 4 -> 80 %, 8 -> 100 %
    r = _sweep(runner, endpoint_matrix, ledger_path, StubConfig(ttft_ms=60, itl_ms=2, kv_per_request=0.2))
    assert "saturated at concurrency 4: KV-cache use peaked at 80.0% (>= 75%)" not in r.output
    assert "saturated at concurrency 8: KV-cache use peaked" in r.output
    levels = {x["level"] for x in Database(ledger_path)["requests"].rows_where("is_warmup = 0")}
    assert levels == {"c=1", "c=2", "c=4", "c=8"}
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(ledger_path)]).output)
    cap = rep["findings"]["capacity"][0]
    assert cap["measured_saturation_concurrency"] == 8
    assert cap["max_concurrency_tested"] == 8


@pytest.mark.integration
def test_stop_kv_moves_the_saturation_point(runner, endpoint_matrix, ledger_path):
    r = _sweep(runner, endpoint_matrix, ledger_path, StubConfig(ttft_ms=60, itl_ms=2, kv_per_request=0.2),
               "--stop-kv", "0.75")
    assert "saturated at concurrency 4: KV-cache use peaked at 80.0% (>= 75%)" in r.output
    levels = {x["level"] for x in Database(ledger_path)["requests"].rows_where("is_warmup = 0")}
    assert levels == {"c=1", "c=2", "c=4"}  # it stopped there
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(ledger_path)]).output)
    assert rep["findings"]["capacity"][0]["measured_saturation_concurrency"] == 4  # judged by the run's --stop-kv


@pytest.mark.integration
def test_sweep_stops_on_preemptions_and_attributes_them(runner, endpoint_matrix, ledger_path):
    r = _sweep(runner, endpoint_matrix, ledger_path, StubConfig(ttft_ms=60, itl_ms=2, preempt_over=2))
    assert "saturated at concurrency 4:" in r.output
    assert "preemptions observed" in r.output
    rows = list(Database(ledger_path)["requests"].rows_where("is_warmup = 0 and level = 'c=4'"))
    assert sum(x["srv_preemptions"] or 0 for x in rows) > 0  # carried by the requests that lived through them
    assert all((x["srv_preemptions"] or 0) == 0
               for x in Database(ledger_path)["requests"].rows_where("is_warmup = 0 and level = 'c=2'"))
