"""Load patterns are small types and stop rules are objects: the runner loops over a pattern's
levels and asks the rules, so a new pattern or rule is one type and its tests (this file defines
one of each and runs them through the real runner, against a stub server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from sqlite_utils import Database

from evalkit.execution.inputs import RunInputs
from evalkit.execution.load import Load, load_from_options
from evalkit.execution.patterns import (
    ClosedLoop,
    Level,
    OpenLoop,
    Pattern,
    Sequential,
    Sweep,
    TraceReplay,
    pattern_from_record,
)
from evalkit.execution.skeleton import run_matrix
from evalkit.execution.stops import ErrorRate, KvFull, LevelOutcome, Preempted, Slo, SloBreached, StopRule, Waited
from evalkit.ledger import open_ledger
from evalkit.paths import default_dataset_path
from evalkit.spec.dataset import load_cases
from evalkit.spec.matrix import load_matrix
from evalkit.testing.stub_server import StubConfig, StubServer


@dataclass(frozen=True)
class Ramp(Pattern):
    """A pattern the runner has never heard of: open-loop rates that climb."""

    rates: tuple[float, ...]
    kind: ClassVar[str] = "ramp"

    def levels(self) -> list[Level]:
        return [Level(f"r={r:g}", rate=r, arrival="constant") for r in self.rates]


@dataclass(frozen=True)
class AtMostRequests(StopRule):
    """A rule the runner has never heard of: a variant may send this many requests in all."""

    most: int

    def check(self, o: LevelOutcome) -> str | None:
        return f"sent {o.sent} >= {self.most}" if o.sent >= self.most else None


@pytest.fixture
def stub_matrix(write):
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as s:
        yield load_matrix(write("m.yaml", "name: p\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                                          f"  structured_output: false\nvariants:\n  - name: base\n"
                                          f"    endpoint: {s.base_url}\n"))


def _run(tmp_path, matrix, load: Load, n: int = 4):
    ledger = open_ledger(tmp_path / "l.db")
    run_matrix(ledger, RunInputs.of(matrix, load_cases(default_dataset_path())[:n], default_dataset_path(), load=load))
    return rows_per_level(Database(tmp_path / "l.db"))


def rows_per_level(db: Database) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in db["requests"].rows_where("is_warmup = 0"):
        out[r["level"]] = out.get(r["level"], 0) + 1
    return out


def test_a_new_pattern_runs_without_touching_the_runner(tmp_path, stub_matrix):
    assert _run(tmp_path, stub_matrix, Load(Ramp((20.0, 40.0)))) == {"r=20": 4, "r=40": 4}


def test_a_new_saturation_rule_stops_a_sweep_without_touching_the_runner(tmp_path, stub_matrix):
    load = Load(Sweep((1, 2, 4)), stops=(ErrorRate(), AtMostRequests(8)))
    assert _run(tmp_path, stub_matrix, load) == {"c=1": 4, "c=2": 4}


@pytest.mark.parametrize(("pattern", "levels"), [
    (Sequential(), [("main", 1, False)]),
    (ClosedLoop(4), [("main", 4, False)]),
    (ClosedLoop(4, sequential_pass=True), [("c=1", 1, False), ("c=4", 4, False)]),
    (OpenLoop(2.0), [("main", 1, True)]),
    (Sweep((1, 2)), [("c=1", 1, False), ("c=2", 2, False)]),
    (TraceReplay((0.0, 0.5, 1.0)), [("main", 1, True)]),
])
def test_each_pattern_s_levels(pattern, levels):
    assert [(lv.name, lv.concurrency, lv.open_loop) for lv in pattern.levels()] == levels


@pytest.mark.parametrize("pattern", [Sequential(), ClosedLoop(3), OpenLoop(2.0, "constant", 4, 7), Sweep((1, 2, 8))])
def test_a_pattern_survives_its_record(pattern):
    assert pattern_from_record(pattern.record()) == pattern


def test_a_trace_s_offsets_come_back_from_the_trace_not_the_record():
    p = TraceReplay((0.0, 1.0, 3.0), 2)
    assert pattern_from_record(p.record(), [0.0, 1.0, 3.0]) == p


def test_a_load_survives_its_record():
    load = load_from_options(None, sweep="1,2,4", stop_kv=0.8, slo="e2e=3x", max_error_rate=0.2)
    again = Load.from_record(load.record())
    assert (again.pattern, again.stops, again.slo) == (load.pattern, load.stops, load.slo)


def _outcome(**kw: Any) -> LevelOutcome:
    o = LevelOutcome()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


@pytest.mark.parametrize(("rule", "outcome", "stops"), [
    (KvFull(0.9), _outcome(kv_peak=0.95), True),
    (KvFull(0.9), _outcome(kv_peak=0.5), False),
    (Preempted(), _outcome(preemptions=2.0), True),
    (Preempted(), _outcome(preemptions=0.0), False),
    (Waited(), _outcome(waiting_peak=1.0), True),
    (Waited(), _outcome(waiting_peak=0.0), False),
    (SloBreached(Slo({"e2e": 100.0})), _outcome(latencies={"ttft": [], "tpot": [], "e2e": [50.0, 150.0]}), True),
    (SloBreached(Slo({"e2e": 200.0})), _outcome(latencies={"ttft": [], "tpot": [], "e2e": [50.0, 150.0]}), False),
    (SloBreached(Slo(relative={"e2e": 2.0})), _outcome(by_case={("c", 0): {"e2e": 300.0}},
                                                       reference={("c", 0): {"e2e": 100.0}}), True),
    (ErrorRate(0.5), _outcome(failed=3, sent=4), True),
    (ErrorRate(0.5), _outcome(failed=1, sent=4), False),
])
def test_each_stop_rule(rule, outcome, stops):
    assert (rule.check(outcome) is not None) is stops


def test_error_rate_fails_a_variant_and_saturation_rules_only_saturate():
    assert (ErrorRate.scope, KvFull.scope) == ("failure", "saturation")


def test_every_ledger_write_is_forwarded_by_a_worker_s_ledger():
    from evalkit.ledger.mirror import MirroredLedger
    from evalkit.ledger.store import Ledger, write_methods

    assert write_methods()  # the writes are marked
    assert all(getattr(MirroredLedger, n) is not getattr(Ledger, n) for n in write_methods())


@pytest.mark.parametrize("seed", range(12))
def test_the_thinned_numbers_are_the_points_a_level_outcome_keeps(monkeypatch, seed):
    """`stops.thinned` (the report's over-saturation points from a level's count and its
    unkept requests) equals `LevelOutcome.add`'s thinning fed the rows one at a time: failures
    and unsent requests anywhere, a cap reached exactly, several halvings, no row at all."""
    import random

    from evalkit.execution import stops

    rng = random.Random(seed)
    cap = rng.choice([2, 3, 5, 8])
    monkeypatch.setattr(stops, "SERIES_CAP", cap)
    n = rng.choice([0, cap, cap * 4, rng.randrange(1, 600)])
    fail = rng.choice([0.0, 0.02, 0.5])
    o, unkept = LevelOutcome(keep_latencies=False, keep_cases=False), []
    for i in range(1, n + 1):
        failed, sent = rng.random() < fail, rng.random() > 0.03
        if failed or not sent:
            unkept.append(i)
        o.add({"mono_start_ms": float(i) if sent else None, "e2e_ms": 1.0, "error_class": "x" if failed else None})
    assert stops.thinned(n, unkept) == [int(p.sent) for p in o.series]
