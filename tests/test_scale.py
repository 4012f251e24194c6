"""Runs as long as production: work generated on demand, rows settled and written in batches,
scrapes forgotten once no request needs them, reports that read once and stay linear, charts
that summarise large data and say so, derived tables computed once per change."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from evalkit.execution.load import Load, RunPolicy, Work, build_work
from evalkit.execution.patterns import Level, arrival_offsets
from evalkit.execution.settle import Settler
from evalkit.execution.stops import LevelOutcome
from evalkit.ledger import open_ledger
from evalkit.measure.looplag import LagProbe
from evalkit.measure.telemetry import MetricsScraper, Scrape
from evalkit.reporting import svgplot
from evalkit.reporting.document import SPIKES_SHOWN, findings_blocks
from evalkit.spec.dataset import Case, Message
from evalkit.spec.matrix import Matrix, Telemetry


def _matrix(replicas: int = 1) -> Matrix:
    return Matrix.model_validate({
        "name": "m", "baseline": "a",
        "variants": [{"name": "a", "endpoint": "http://127.0.0.1:1"},
                     {"name": "b", **({"endpoints": [f"http://127.0.0.1:{2 + k}" for k in range(replicas)]}
                                      if replicas > 1 else {"endpoint": "http://127.0.0.1:2"})}],
    })


def _cases(n: int) -> list[Case]:
    return [Case(id=f"c{i}", messages=[Message(role="user", content=f"hello {i}")]) for i in range(n)]


def _key(it: Any) -> tuple:
    return (it.variant, it.case.id, it.repeat, it.replica, it.attempt0)


@pytest.mark.parametrize("order", ["sequential", "alternate"])
def test_work_made_on_demand_is_the_list_a_level_sends(order):
    from evalkit.execution.order import Order

    m, cases = _matrix(), _cases(7)
    load = Load(policy=RunPolicy(order=Order(order, seed=3)))
    listed = [it for it in build_work(m, ["a", "b"], cases, 3, load) if not it.warmup]
    assert [_key(it) for it in Work(m, ["a", "b"], cases, 3, load)] == [_key(it) for it in listed]


def test_work_spreads_a_replicated_variant_by_case():
    m, cases = _matrix(replicas=2), _cases(5)
    got = {(it.case.id, it.replica) for it in Work(m, ["b"], cases, 2, Load())}
    assert got == {(f"c{i}", i % 2) for i in range(5)}


def test_work_leaves_out_what_a_resume_has_and_starts_at_the_next_attempt():
    m, cases = _matrix(), _cases(3)
    w = Work(m, ["b"], cases, 1, Load(), skip={("b", "c0", 0, "main")}, attempts={("b", "c1", 0, "main"): 2})
    assert [(it.case.id, it.attempt0) for it in w] == [("c1", 2), ("c2", 0)]


def test_work_counts_per_variant_without_listing():
    w = Work(_matrix(), ["a", "b"], _cases(4), 2, Load())
    assert (w.count("a"), w.count("b"), len(w)) == (4 * 3, 4 * 2, 20)  # the baseline's extra noise-floor pass


def test_work_limited_to_the_cases_a_time_budget_kept():
    w = Work(_matrix(), ["b"], _cases(4), 1, Load()).only({"c1", "c3"})
    assert [it.case.id for it in w] == ["c1", "c3"]


def test_open_loop_arrivals_on_demand_are_the_seeded_schedule():
    lv = Level("main", rate=20.0, arrival_seed=7)
    assert lv.schedule(300) == arrival_offsets(300, 20.0, "poisson", 7)


def test_a_batch_of_rows_with_different_columns_is_written_whole(tmp_path):
    db = open_ledger(tmp_path / "l.db")
    db.insert_requests([{"run_id": "r", "variant": "a", "seq": 1, "turn": 2},
                        {"run_id": "r", "variant": "b", "seq": 2, "client_proc": 3}])
    got = [(r["variant"], r["turn"], r["client_proc"]) for r in db._db.query("select * from requests order by seq")]
    assert got == [("a", 2, None), ("b", None, 3)]


def _scraper(times: list[float]) -> MetricsScraper:
    sc = MetricsScraper(None, "r", "a", "http://x", 0.0)  # type: ignore[arg-type]
    for t in times:
        sc.history.append(Scrape(t, {"kv_cache_usage_perc": t / 1000.0}))
        sc._t.append(t)
    return sc


@pytest.mark.parametrize("start,end", [(0.0, 50.0), (120.0, 480.0), (500.0, 500.0), (999.0, 2000.0), (-5.0, 10.0)])
def test_scraper_lookups_by_bisection_agree_with_a_scan(start, end):
    sc = _scraper([100.0 * k for k in range(10)])
    last_before = next((s.values for s in reversed(sc.history) if s.mono_ms <= start), sc.history[0].values)
    first_after = next((s.values for s in sc.history if s.mono_ms >= end), sc.history[-1].values)
    inside = [s for s in sc.history if start <= s.mono_ms <= end]
    assert (sc.at(start), sc.first_after(end), sc.scrapes_in(start, end),
            sc.peak("kv_cache_usage_perc", start, end)) == (
        last_before, first_after, len(inside),
        max([s.values["kv_cache_usage_perc"] for s in inside] + [last_before["kv_cache_usage_perc"]]))


def test_forgetting_old_scrapes_keeps_what_an_open_request_starts_from():
    sc = _scraper([100.0 * k for k in range(10)])
    before = sc.at(450.0)
    sc.forget_before(450.0)
    assert (len(sc.history), sc.at(450.0)) == (6, before)  # 400 (its start's) and everything after


def _settler(tmp_path: Any, keep_latencies: bool = False) -> tuple[Settler, LagProbe, list[float]]:
    db = open_ledger(tmp_path / "l.db")
    clock = [1000.0]
    probe = LagProbe(0.0)
    s = Settler(db, Telemetry(), {0: probe}, {}, {}, lambda: clock[0], keep_latencies=keep_latencies, keep_cases=False)
    s.start_level(window_attribution=False, keep_rows=False)
    return s, probe, clock


def _row(start: float, e2e: float, **kw: Any) -> dict[str, Any]:
    return {"run_id": "r", "variant": "a", "case_id": "c", "repeat": 0, "seq": 1, "is_warmup": 0, "final": 1,
            "replica": None, "mono_start_ms": start, "e2e_ms": e2e, "ttft_ms": 5.0, "tpot_ms": 1.0,
            "error_class": None, "timestamp_source": "kernel", "first_read_chunks": 1, **kw}


def test_a_row_waits_until_the_lag_probe_has_passed_its_end(tmp_path):
    s, probe, _ = _settler(tmp_path)
    probe.times, probe.lags = [900.0], [0.1]
    s.add(_row(800.0, 150.0))  # ends at 950: the probe has only reached 900
    s.settle()
    assert (len(s.unsettled), s.written) == (1, 0)


def test_a_row_is_written_once_the_probe_passed_it_with_its_lag(tmp_path):
    s, probe, _ = _settler(tmp_path)
    probe.times, probe.lags = [900.0, 1000.0], [0.1, 30.0]
    s.add(_row(800.0, 150.0))
    s.settle()
    lag = next(s.ledger._db.query("select client_lag_max_ms, timing_suspect from requests"))
    assert (s.written, lag["client_lag_max_ms"], lag["timing_suspect"]) == (1, 30.0, 0)  # kernel stamps, one chunk


def test_a_row_never_waits_past_the_horizon_for_a_probe_that_stopped(tmp_path):
    s, probe, clock = _settler(tmp_path)
    probe.times, probe.lags = [100.0], [0.1]
    s.add(_row(800.0, 150.0))
    clock[0] = 950.0 + s.horizon_ms + 1
    s.settle()
    assert s.written == 1


@pytest.mark.parametrize("keep", [False, True])
def test_the_stop_rules_keep_per_request_latencies_only_when_an_slo_asks(tmp_path, keep):
    s, probe, _ = _settler(tmp_path, keep_latencies=keep)
    probe.times, probe.lags = [5000.0], [0.1]
    for k in range(50):
        s.add(_row(10.0 * k, 20.0, seq=k + 1))
    s.settle()
    o = s.outcomes["a"]
    assert (o.n, len(o.latencies["ttft"])) == (50, 50 if keep else 0)


def test_a_level_outcome_without_an_slo_keeps_nothing_per_case():
    o = LevelOutcome(keep_latencies=False, keep_cases=False)
    for k in range(100):
        o.add({**_row(0.0, 1.0), "case_id": f"c{k}"})
    assert (o.n, o.by_case) == (100, {})


def test_the_text_report_lists_the_largest_spikes_and_says_how_many_there_are():
    spikes = [{"robust_z": float(k), "line": f"spike {k}"} for k in range(100)]
    lines = findings_blocks({"spikes": spikes, "paired": [], "verdicts": [], "notes": []}, None)
    text = [x for x in lines if isinstance(x, str)]
    assert (sum(x.startswith("  spike") for x in text), "  spike 99" in text,
            any(f"the {SPIKES_SHOWN} largest of 100" in x for x in text)) == (SPIKES_SHOWN, True, True)


@pytest.mark.parametrize("n", [50_000, 400_000])
def test_a_cdf_of_many_points_is_drawn_through_quantiles_and_says_so(n):
    ranks = sorted({0, n - 1, *(round(k * (n - 1) / svgplot.MAX_POINTS) for k in range(svgplot.MAX_POINTS + 1))})
    svg = svgplot.cdf("t", "x", {"a": (n, [(i, float(i % 997)) for i in ranks])})
    assert (len(svg) < 120_000, f"{n:,} requests per line at most" in svg) == (True, True)


def test_a_large_scatter_drawn_as_bands_says_so():
    from evalkit.ledger.chart_reads import Bands

    rows = {"a": [(k + 0.5, float(k), k + 1.0, k + 2.0) for k in range(40)]}
    svg = svgplot.bands("t", "x", "y", Bands(30_000, 0.0, 40.0, False, rows), [(1.0, 36.0)] * 500, None)
    assert (len(svg) < 40_000, "10th-90th percentile band" in svg, "the 50 largest of 500 spikes" in svg) == \
        (True, True, True)


def test_a_small_scatter_still_draws_every_point():
    svg = svgplot.scatter("t", "x", "y", {"a": [(float(k), float(k)) for k in range(30)]})
    assert len(re.findall("<circle", svg)) == 30


def test_a_long_timeline_keeps_its_peak():
    s = [(float(k), 1.0) for k in range(20_000)]
    s[12_345] = (12_345.0, 50.0)
    cut = svgplot.envelope(s)
    assert (len(cut) <= svgplot.MAX_POINTS, max(y for _, y in cut)) == (True, 50.0)


def test_derived_tables_are_stale_only_when_the_run_changed(tmp_path):
    db = open_ledger(tmp_path / "l.db")
    db._db["runs"].insert({"id": "r1", "status": "complete", "created_at": "2026-01-01"})
    db.replace_derived("r1", [], [], [], [])
    fresh = db.stale_derived()
    db.insert_requests([{"run_id": "r1", "variant": "a", "seq": 1}])
    assert (fresh, db.stale_derived()) == ([], ["r1"])


def test_open_loop_arrivals_become_tasks_only_when_due():
    """A million arrivals are never a million waiting tasks: the scheduler pulls each item (and
    makes its task) only once the one before it was due, however late its own loop runs."""
    from evalkit.execution.sender import Sender

    n, rate = 400, 2000.0
    pulled: list[float] = []  # when each item was taken from the generator, s after t0
    sent: list[int] = []

    async def go() -> float:
        s = Sender.__new__(Sender)
        s.epoch = time.perf_counter()
        s.pool = None  # sent from this process

        async def one(http: Any, item: Any, attribute_now: bool, scheduled_ms: float | None = None) -> list:
            sent.append(item)
            await asyncio.sleep(0.001)
            return []

        def items():
            for i in range(n):
                pulled.append(time.perf_counter() - t0)
                yield i

        s.send_item = one  # type: ignore[method-assign]
        t0 = time.perf_counter()
        await s._open_loop(None, items(), Level("main", rate=rate, arrival="constant"))  # type: ignore[arg-type]
        return t0

    asyncio.run(go())
    assert sorted(sent) == list(range(n))
    # item i is taken after item i-1 was due (the schedule starts 5 ms after t0, one every 0.5 ms)
    early = [i for i in range(1, n) if pulled[i] < (i - 1) / rate]
    assert early == []
