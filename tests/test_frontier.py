"""The capacity frontier: over-saturation as a stop rule, the bracket-and-bisect search, and a
search against a server whose capacity is known (k parallel slots, a fixed service time)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests as http
from sqlite_utils import Database

from evalkit.errors import UsageError
from evalkit.execution.frontier import Bisection, Frontier, Probe, frontier, ratio
from evalkit.execution.inputs import RunInputs
from evalkit.execution.patterns import Sequential, pattern_from_record, probe_load, probe_name
from evalkit.execution.probing import Search
from evalkit.execution.search import parse_search_slo, search_load
from evalkit.execution.skeleton import run_matrix
from evalkit.execution.stops import LevelOutcome, OverSaturated, saturation_signals
from evalkit.ledger import open_ledger
from evalkit.paths import default_dataset_path
from evalkit.spec.dataset import load_cases
from evalkit.spec.matrix import load_matrix


def _search(axis: str, truth: float, start: float, budget: int = 8, spent: int = 1) -> Bisection:
    """A search against an oracle: a load passes when it is at or under the truth."""
    b = Bisection(axis, start, budget, spent=spent)
    while (load := b.next_load()) is not None:
        b.add(Probe(load, load <= truth))
    return b


@pytest.mark.parametrize("truth", [3.0, 17.5, 40.0, 61.0])
def test_a_rate_search_lands_within_15_percent_of_the_truth(truth):
    assert _search("rate", truth, start=truth / 4.3).result().best >= truth / 1.15


@pytest.mark.parametrize("truth", [3.0, 17.5, 40.0, 61.0])
def test_a_rate_search_spends_at_most_8_probes_with_its_reference(truth):
    assert len(_search("rate", truth, start=truth / 4.3).probes) + 1 <= 8


@pytest.mark.parametrize("truth", [3.0, 17.5, 40.0, 61.0])
def test_the_rate_searchs_interval_holds_the_truth(truth):
    f = _search("rate", truth, start=truth / 4.3).result()
    assert f.lo <= truth < f.hi


@pytest.mark.parametrize("truth", [1, 4, 6])
def test_a_concurrency_search_finds_a_small_level_exactly(truth):
    assert _search("concurrency", truth, start=1, spent=0).result().best == truth


def test_a_concurrency_search_brackets_a_large_level_within_its_budget():
    f = _search("concurrency", 13, start=1, spent=0).result()
    assert f.lo <= 13 < f.hi


def test_the_knee_is_probed_twice():
    b = _search("rate", 10.0, start=2.0)
    assert sum(p.load == b.result().best for p in b.probes) == 2


def test_a_knee_that_fails_when_probed_again_moves_the_answer_down():
    f = frontier("rate", [Probe(1.0, True), Probe(2.0, True), Probe(4.0, False), Probe(2.0, False)])
    assert (f.best, f.hi) == (1.0, 2.0)


def test_nothing_passing_has_no_answer():
    assert frontier("rate", [Probe(4.0, False), Probe(2.0, False)]).best is None


def test_the_ratio_carries_the_interval_of_both_brackets():
    a = Frontier("rate", 20.0, 20.0, 22.0)
    b = Frontier("rate", 10.0, 10.0, 11.0)
    assert ratio(a, b) == pytest.approx((2.0, 20.0 / 11.0, 2.2))


def test_an_over_saturated_probe_aims_the_next_probe_under_what_the_server_finished():
    b = Bisection("rate", 10.0, 8)
    for p in (Probe(10.0, True), Probe(20.0, True), Probe(80.0, False, achieved=25.0, signals=("rate",))):
        b.add(p)
    assert b.next_load() == pytest.approx((20.0 * 27.5) ** 0.5)


def _outcome(n: int, queue=lambda i: 0.0, waiting=lambda i: 0.0, gap_ms: float = 100.0, service_ms: float = 100.0,
             finish_gap_ms: float | None = None) -> LevelOutcome:
    o = LevelOutcome()
    for i in range(n):
        end = i * (finish_gap_ms or gap_ms) + service_ms
        o.add({"mono_start_ms": i * gap_ms, "e2e_ms": end - i * gap_ms, "scheduled_ms": i * gap_ms,
               "srv_queue_ms": queue(i), "srv_waiting_start": waiting(i), "error_class": None, "case_id": str(i),
               "repeat": 0})
    return o


def test_a_steady_level_is_not_over_saturated():
    assert saturation_signals(_outcome(30)) == {}


def test_a_growing_waiting_queue_is_over_saturation():
    assert "queue" in saturation_signals(_outcome(30, waiting=lambda i: i / 2))


def test_growing_queue_time_is_over_saturation():
    assert "queue" in saturation_signals(_outcome(30, queue=lambda i: 20.0 * i))


def test_finishing_behind_the_offered_rate_is_over_saturation():
    assert "rate" in saturation_signals(_outcome(30, finish_gap_ms=150.0))


def test_kv_at_its_ceiling_with_preemptions_is_over_saturation():
    o = _outcome(30)
    o.kv_peak, o.preemptions = 0.97, 3.0
    assert "kv" in saturation_signals(o)


def test_kv_at_its_ceiling_without_preemptions_is_not():
    o = _outcome(30)
    o.kv_peak, o.preemptions = 0.97, 0.0
    assert saturation_signals(o) == {}


def test_a_level_too_short_for_a_trend_shows_none():
    assert saturation_signals(_outcome(6, waiting=lambda i: 10 * i)) == {}


def test_the_rule_names_the_signal_that_fired():
    assert "[rate]" in (OverSaturated().check(_outcome(30, finish_gap_ms=150.0)) or "")


def test_a_long_level_keeps_a_bounded_series():
    assert len(_outcome(20000).series) < 4096


def test_an_unknown_pattern_kind_is_refused_not_run_sequentially():
    with pytest.raises(UsageError, match="not one this evalkit knows"):
        pattern_from_record({"kind": "ramp", "mode": "rate", "rate": 3.0})


def test_a_record_without_a_kind_is_still_read():
    assert pattern_from_record({"mode": "sequential"}) == Sequential()


def test_a_search_is_not_resumed_as_something_else():
    with pytest.raises(UsageError, match="does not resume"):
        pattern_from_record(Search("concurrency", 6, 0.1).record())


def test_probe_names_are_unique_and_read_back():
    taken = {"r=3.5"}
    assert probe_load(probe_name("rate", 3.5, taken)) == ("rate", 3.5)


def test_a_second_probe_of_a_load_gets_its_own_level():
    assert probe_name("concurrency", 4, {"c=4"}) == "c=4#2"


def test_search_slos_take_percentile_names_and_units():
    s = parse_search_slo("ttft_p99=2s,itl_p99=80ms,e2e=3x")
    assert (s.absolute_ms, s.relative) == ({"ttft": 2000.0, "tpot": 80.0}, {"e2e": 3.0})


def test_a_search_refuses_another_percentile():
    with pytest.raises(UsageError, match="p50"):
        parse_search_slo("ttft_p50=2s")


def test_a_search_refuses_an_unknown_axis():
    with pytest.raises(UsageError, match="rate or concurrency"):
        search_load("tokens", None)


# --- against a server of known capacity ----------------------------------------------------------

K, TTFT_MS, ITL_MS, TOKENS = 6, 120.0, 60.0, 4  # 6 slots, 300 ms a request: 20 requests/s at most
TRUTH = K / ((TTFT_MS + (TOKENS - 1) * ITL_MS) / 1000.0)


@pytest.fixture(scope="module")
def slots_server():
    """The stub in its own process (the client's load does not slow it): K slots, fixed service."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(port),
                             "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--kv-tokens", "1000000",
                             "--max-num-seqs", str(K)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            http.get(f"{url}/health", timeout=1)
            break
        except http.RequestException:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the slots stub did not start") from None
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


class _Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)

    def level_start(self, name: str, total: int) -> None:
        pass

    def request_done(self, *a) -> None:
        pass

    def level_end(self, name: str) -> None:
        pass


def _search_run(tmp_path: Path, url: str, axis: str, slo: str | None, n: int,
                time_s: float = 60.0) -> tuple[Database, list[str]]:
    m = tmp_path / "m.yaml"
    m.write_text(f"name: frontier\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                 f"  max_tokens: {TOKENS}\n  temperature: 0\n  extra_body: {{ignore_eos: true}}\n"
                 f"  structured_output: false\ntelemetry:\n  interval_s: 0.1\n"
                 f"variants:\n  - name: base\n    endpoint: {url}\n")
    said = _Said()
    cases = load_cases(default_dataset_path())[:n]
    run_matrix(open_ledger(tmp_path / "l.db"),
               RunInputs.of(load_matrix(m), cases, default_dataset_path(), load=search_load(axis, slo, time_s=time_s)),
               said)
    return Database(tmp_path / "l.db"), said.lines


@pytest.fixture(scope="module")
def rate_search(slots_server, tmp_path_factory):
    return _search_run(tmp_path_factory.mktemp("rate"), slots_server, "rate", None, 40)


def _frontier_line(lines: list[str]) -> str:
    return next(line for line in lines if "frontier base:" in line)


@pytest.mark.integration
def test_the_rate_search_reports_the_max_rate_within_15_percent(rate_search):
    best = float(_frontier_line(rate_search[1]).split("sustains ")[1].split(" req/s")[0])
    assert TRUTH / 1.15 <= best <= TRUTH * 1.15, "\n".join(rate_search[1])


@pytest.mark.integration
def test_the_rate_search_takes_at_most_8_levels(rate_search):
    db, _ = rate_search
    assert len({r["level"] for r in db["requests"].rows_where("is_warmup = 0")}) <= 8


@pytest.mark.integration
def test_the_rate_search_names_the_over_saturated_level(rate_search):
    assert "first over-saturated level r=" in _frontier_line(rate_search[1])


@pytest.mark.integration
def test_every_probe_is_a_level_in_the_ledger(rate_search):
    db, lines = rate_search
    probed = {line.split("probe ")[1].split(":")[0] for line in lines if "' probe " in line or line.startswith("'base' probe")}
    assert probed <= {r["level"] for r in db["requests"].rows_where("is_warmup = 0")}


@pytest.mark.integration
def test_a_concurrency_search_finds_the_slots_at_a_relative_slo(slots_server, tmp_path):
    _, lines = _search_run(tmp_path, slots_server, "concurrency", "ttft=3x", 24, time_s=120.0)
    assert f"sustains {K} in flight" in _frontier_line(lines)


@pytest.mark.integration
def test_the_report_derives_the_same_frontier_and_names_the_signal(rate_search):
    from evalkit.reporting.findings import findings

    db, lines = rate_search
    notes = findings(open_ledger(Path(db.conn.execute("pragma database_list").fetchone()[2]), create=False))["notes"]
    assert _frontier_line(lines).split("frontier base: ")[1].split(" at ")[0] in " ".join(notes)


@pytest.mark.integration
def test_the_load_curve_marks_the_first_saturated_level_with_its_signal(rate_search):
    from evalkit.reporting.findings import findings

    db, _ = rate_search
    notes = findings(open_ledger(Path(db.conn.execute("pragma database_list").fetchone()[2]), create=False))["notes"]
    assert any(n.startswith("load curve base:") and "first saturated at r=" in n
               and any(f"[{sig}]" in n for sig in ("queue", "rate", "kv")) for n in notes), notes


def test_search_refuses_a_load_shape_of_its_own(runner, tmp_path):
    from evalkit.cli import cli

    r = runner.invoke(cli, ["run", "--search", "rate", "--sweep", "1,2", "--ledger", str(tmp_path / "l.db")])
    assert (r.exit_code, r.output.strip().splitlines()[-1]) == (2, "Error: --search chooses its own load levels: drop --sweep")


@pytest.mark.integration
def test_evalkit_run_search_prints_the_frontier(runner, slots_server, tmp_path):
    from evalkit.cli import cli

    m = tmp_path / "m.yaml"
    m.write_text(f"name: frontier\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                 f"  max_tokens: {TOKENS}\n  temperature: 0\n  extra_body: {{ignore_eos: true}}\n"
                 f"  structured_output: false\nvariants:\n  - name: base\n    endpoint: {slots_server}\n")
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--search", "rate", "--max-probes", "4", "--search-time", "40s",
                            "--limit", "12", "--no-grade", "--ledger", str(tmp_path / "l.db")])
    assert "frontier base: " in r.output, r.output


def test_search_time_goes_with_search(runner, tmp_path):
    from evalkit.cli import cli

    r = runner.invoke(cli, ["run", "--search-time", "5m", "--ledger", str(tmp_path / "l.db")])
    assert (r.exit_code, r.output.strip().splitlines()[-1]) == (
        2, "Error: --search-time bounds a --search: give --search rate or --search concurrency")


@pytest.mark.integration
def test_the_html_report_draws_the_load_curve_with_its_marks(rate_search):
    from evalkit.reporting.html import render_html

    db, _ = rate_search
    html = render_html(open_ledger(Path(db.conn.execute("pragma database_list").fetchone()[2]), create=False))
    assert "Load curve: finished vs offered load" in html and "base saturated" in html
