"""A frontier search that claims only what its probes reached and ends in a stated time (issue 46,
item 3): probes sized by their statistic and their level, never by the dataset; claims capped at
what the probes held; a time bound planned up front; no interval from zero pairs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.search_acceptance import claim, cli, matrix, stub
from evalkit.errors import UsageError
from evalkit.execution.frontier import Bisection, Probe, frontier
from evalkit.execution.patterns import BURST
from evalkit.execution.probe_size import P99_NEED, SearchPlan, closed_requests, need, rate_requests
from evalkit.execution.probing import Search, SearchSchedule, probe_verdict
from evalkit.execution.stops import LevelOutcome, Slo, SloBreached, in_flight
from evalkit.ledger import open_ledger
from evalkit.reporting.under_load import lines as under_load_lines

ROOT = Path(__file__).resolve().parents[1]


# --- sizing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("slo", "n"), [(True, P99_NEED), (False, 30)])
def test_a_probe_needs_what_its_statistic_needs(slo, n):
    assert need(slo) == n


@pytest.mark.parametrize("c", [1, 16, 64])
def test_a_closed_loop_probe_sends_at_least_four_times_its_concurrency(c):
    assert closed_requests(c, 30) >= 4 * c


@pytest.mark.parametrize("c", [1, 16, 64])
def test_a_closed_loop_probe_sends_at_least_a_p99s_requests(c):
    assert closed_requests(c, P99_NEED) >= P99_NEED


@pytest.mark.parametrize("rate", [0.5, 7.0, 300.0])
def test_an_open_loop_probe_lasts_at_least_its_planned_length(rate):
    assert (rate_requests(rate, 12.0, P99_NEED) - 1) / rate >= 12.0


def test_a_search_time_too_short_for_its_levels_is_refused():
    with pytest.raises(UsageError, match="--search-time"):
        SearchPlan("rate", 20.0, 2, 8, P99_NEED, False, True).check()


@pytest.mark.parametrize(("time_s", "probes"), [(600.0, 8), (30.0, 6), (15.0, 3)])
def test_the_time_bound_plans_how_many_levels_fit(time_s, probes):
    assert SearchPlan("rate", time_s, 1, 8, P99_NEED, False, True).probes == probes


@pytest.mark.parametrize("said", ["up to 8 levels per variant", "a throughput burst", "a p99 needs 100",
                                  "15 s each at its rate", "2 min per variant, 4 min in all"])
def test_the_plan_says_what_the_search_will_do(said):
    assert said in SearchPlan("rate", 240.0, 2, 8, P99_NEED, False, True).line()


# --- what a probe reached ---------------------------------------------------------------------------

@pytest.mark.parametrize(("spans", "peak"), [
    ([(None, 0.0, 10.0), (None, 10.0, 20.0), (None, 20.0, 30.0)], 1),  # a closed loop of 1: back to back
    ([(None, 0.0, 10.0), (None, 5.0, 15.0), (None, 6.0, 8.0)], 3),
    ([(0, 0.0, 10.0), (1, 0.0, 10.0)], 2),  # two servers, each on its own clock
])
def test_in_flight_counts_the_most_requests_out_at_once(spans, peak):
    assert in_flight(spans)[0] == peak


def _level(n: int, gap_ms: float, service_ms: float = 50.0, open_loop: bool = True) -> LevelOutcome:
    o = LevelOutcome()
    for i in range(n):
        o.add({"mono_start_ms": i * gap_ms, "e2e_ms": service_ms, "scheduled_ms": i * gap_ms if open_loop else None,
               "ttft_ms": 20.0, "error_class": None, "case_id": str(i % 16), "repeat": i // 16})
    return o


def test_a_rate_probe_of_16_requests_over_a_tenth_of_a_second_is_not_a_pass():
    # the user's 1.62e+03 req/s: 16 requests that lasted 0.1 s
    assert not probe_verdict((), 1620.0, _level(16, 6.0), "r=1620", need_n=30, open_loop=True).passed


def test_a_probe_too_small_to_judge_sets_no_upper_bound():
    assert probe_verdict((), 1620.0, _level(16, 6.0), "r=1620", need_n=30, open_loop=True).inconclusive


def test_a_probe_with_fewer_requests_than_a_p99_needs_is_not_a_pass():
    slo = (SloBreached(Slo({"ttft": 200.0})),)
    assert not probe_verdict(slo, 4.0, _level(16, 100.0, open_loop=False), "c=4", need_n=P99_NEED).passed


def _probes_at_64_holding_16() -> list[Probe]:
    return [Probe(c, True, level=f"c={c:.0f}", n=16, in_flight=min(c, 16)) for c in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)]


def test_a_concurrency_claim_is_capped_at_what_its_probes_held():
    assert frontier("concurrency", _probes_at_64_holding_16()).claim == 16


@pytest.mark.parametrize("said", ["sustains at least 16 in flight", "its probes never had more than 16 in flight",
                                  "(c=64: it sent 16 requests)"])
def test_a_capped_claim_says_the_cap_and_why(said):
    assert said in frontier("concurrency", _probes_at_64_holding_16()).line("base", "ttft p99 ≤ 200 ms")


def test_a_rate_claim_is_never_above_the_rate_the_server_finished():
    f = frontier("rate", [Probe(10.0, True, achieved=9.6), Probe(20.0, False)])
    assert f.claim == 9.6


@pytest.mark.parametrize("said", ["max rate between 4 and 16 req/s", ": stopped at the time bound"])
def test_a_search_out_of_time_ends_with_its_bracket(said):
    f = frontier("rate", [Probe(4.0, True, achieved=4.0), Probe(16.0, False)], stopped="time")
    assert said in f.line("base", "ttft p99 ≤ 1000 ms")


def test_a_rate_search_climbs_to_just_above_its_bursts_throughput():
    b = Bisection("rate", 7.5, 8, ceiling=10.0)
    b.add(Probe(7.5, True))
    assert b.next_load() == pytest.approx(12.5)


def test_a_search_stops_when_its_next_probe_does_not_fit_the_time_left():
    s = SearchSchedule(Search("rate", time_s=600.0), (SloBreached(Slo({"ttft": 1000.0})),))
    level = next(s)
    assert level.name == BURST
    s.deadline = time.monotonic() + 2.0  # 2 s left: a probe of at least 100 requests at ~7.5/s does not fit
    said = s.observe("base", level, _level(48, 100.0, open_loop=False))
    assert any("does not fit" in line for line in said), said


# --- quality under load: no interval from zero pairs -------------------------------------------------

@pytest.mark.parametrize("deltas", [{}, {"schema_pass": {"delta": 0.0, "ci95": [0.0, 0.0], "pairs": 0}}])
def test_quality_under_load_over_zero_pairs_says_no_pairs(deltas):
    e = {"variant": "base", "level": 16, "pairs": 0, "identical_pct": None, "drift_mean": None, "deltas": deltas}
    assert under_load_lines([e])[0].startswith("quality under load base: concurrency 16 vs 1 over 0 pairs: no pairs")


def test_quality_under_load_over_zero_pairs_prints_no_interval():
    e = {"variant": "base", "level": 16, "pairs": 0, "identical_pct": None, "drift_mean": None,
         "deltas": {"schema_pass": {"delta": 0.0, "ci95": [0.0, 0.0], "pairs": 0}}}
    assert "[" not in under_load_lines([e])[0]



# --- against servers of known capacity ---------------------------------------------------------------

@pytest.fixture(scope="module")
def wide_search(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """`--search concurrency` over 16 cases against a server with room for 256 (35 ms a request): no
    probe fails, so the search climbs past the dataset's 16 cases until its budget of 8 levels (the last the knee again)."""
    proc, url = stub(256, 20.0, 5.0)
    d = tmp_path_factory.mktemp("wide")
    try:
        r, _ = cli("run", "--matrix", str(matrix(d / "m.yaml", 4, {"base": url})), "--search", "concurrency",
                   "--slo", "ttft_p99=1s", "--max-probes", "8", "--search-time", "2m", "--limit", "16",
                   "--no-grade", "--ledger", str(d / "l.db"), timeout=300)
    finally:
        proc.terminate()
        proc.wait(10)
    assert r.returncode == 0, r.stdout + r.stderr
    yield r.stdout + r.stderr, d / "l.db"


def _ledger_in_flight(path: Path) -> dict[str, int]:
    """Each probe level's most requests in flight at once, from the ledger's rows."""
    with open_ledger(path, create=False) as led:
        run = led.require_run(None)["id"]
        spans: dict[str, list] = {}
        for r in led.iter_measured(run, lean=True, with_cases=False):
            spans.setdefault(r["level"], []).append((r["replica"], r["mono_start_ms"],
                                                     r["mono_start_ms"] + (r["e2e_ms"] or 0.0)))
    return {level: in_flight(s)[0] for level, s in spans.items()}


@pytest.mark.integration
def test_a_concurrency_search_on_16_cases_claims_no_more_than_its_probes_held(wide_search):
    out, ledger = wide_search
    said = claim(out, "base")
    assert said <= _ledger_in_flight(ledger)[f"c={said:.0f}"], out


@pytest.mark.integration
@pytest.mark.parametrize("c", [1, 2, 4, 8, 16, 32, 64])
def test_its_probes_fill_their_levels_past_the_datasets_16_cases(wide_search, c):
    _, ledger = wide_search
    assert _ledger_in_flight(ledger)[f"c={c}"] == c


@pytest.mark.integration
@pytest.mark.parametrize("said", ["sustains at least 64 in flight", "its probes never had more than 64 in flight",
                                  "(the probe budget was spent)"])
def test_its_line_says_the_cap_and_why(wide_search, said):
    out, _ = wide_search
    assert said in next(x for x in out.splitlines() if "frontier base:" in x), out


@pytest.mark.integration
def test_it_says_its_plan_first(wide_search):
    out, _ = wide_search
    assert "search concurrency: up to 8 levels per variant" in out, out


# The acceptance against two servers of known capacity (a 4-minute search) is a benchmark:
# benchmarks/search_acceptance.py; tests/test_frontier.py checks the rate search's claim on a shorter one.
