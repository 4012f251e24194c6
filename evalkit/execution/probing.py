"""A frontier search's probes (`--search`): the `Search` pattern, each probe's verdict, and the
schedule that chooses the next probe from the last outcome within the search's time.

Per variant: the unloaded reference (every case once, one at a time) only when an SLO is relative;
a rate search's throughput burst, which sets its first rate; then probes bracketed and bisected
(`frontier.Bisection`), each sized by `probe_size` to fill its level and recorded with what it
reached (requests, length, finished rate, most in flight). A probe starts only when its estimated
length fits what is left of the variant's share of the time; otherwise the search ends with the
bracket it has, and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from ..stats import percentile
from .frontier import Bisection, Frontier, Probe, frontier
from .patterns import BURST, REFERENCE, Arrival, Level, Pattern, Schedule, probe_name
from .probe_size import (
    CAL_CONCURRENCY,
    CAL_REQUESTS,
    CAL_START,
    DEFAULT_SEARCH_TIME_S,
    SearchPlan,
    closed_requests,
    dur,
    need,
    rate_requests,
    too_short,
)
from .stops import LevelOutcome, OverSaturated, Slo, SloBreached, StopRule, rates, reasons, saturation_signals, steady, throughput


def reference_is_probe(axis: str, slo: Slo) -> bool:
    """A concurrency search at relative SLOs only: its unloaded reference is its c=1 probe (each case
    compared with itself meets any factor); with an absolute limit too, c=1 is probed at its size."""
    return axis == "concurrency" and bool(slo.relative) and not slo.absolute_ms


def level_need(level: str, axis: str, slo: Slo) -> int:
    """Requests a level's verdict needs (the reference that is a probe: none, it compares with itself)."""
    return 0 if level == REFERENCE and reference_is_probe(axis, slo) else need(bool(slo))


def probe_problems(n_ok: int, wall_s: float | None, open_loop: bool, need_n: int) -> list[str]:
    """Why a probe cannot pass whatever its rules say: too few requests for its statistic, or (an open
    loop) too short to measure its rate."""
    out = []
    if n_ok < need_n:
        out.append(f"too few requests for its verdict ({n_ok} < {need_n})")
    if open_loop and (short := too_short(n_ok, wall_s)):
        out.append(short)
    return out


def probe_verdict(stops: tuple[StopRule, ...], load: float, o: LevelOutcome, level: str = "",
                  need_n: int = 0, open_loop: bool = False) -> Probe:
    """A probe passes when no saturation rule (SLOs, over-saturation) nor failure rule fires and it
    was big enough to show it (`probe_problems`); it keeps what it reached."""
    fired = [w for w in (reasons(stops, "failure", o), reasons(stops, "saturation", o)) if w]
    small = probe_problems(o.n - o.errors, o.wall_s, open_loop, need_n)
    kv = next((r.kv_ceiling for r in stops if isinstance(r, OverSaturated)), 0.9)
    return Probe(load, not (fired or small), "; ".join(fired + small) or None, rates(o)[1],
                 tuple(saturation_signals(o, kv)), level, n=o.n, duration_s=o.wall_s, in_flight=o.in_flight_peak,
                 in_flight_mean=o.in_flight_mean, throughput=throughput(o), inconclusive=bool(small and not fired))


@dataclass(frozen=True)
class Search(Pattern):
    """The capacity frontier: the highest rate (open loop) or concurrency (closed loop) at which the
    variant meets its SLOs without over-saturating, within ``time_s`` for all ``variants``."""

    axis: Literal["rate", "concurrency"] = "rate"
    max_probes: int = 8  # every level counts, the reference, the burst and the knee's second probe too
    tolerance: float = 0.1  # the bracket closes when its top is within this of its bottom
    arrival: Arrival = "constant"  # constant gaps: a queue grows only when the server falls behind
    arrival_seed: int = 0
    start: float | None = None  # the first probe's load [a rate search: 3/4 of its burst's throughput]
    time_s: float = DEFAULT_SEARCH_TIME_S  # --search-time: every variant's search together
    variants: int = 1
    kind: ClassVar[str] = "search"
    adaptive: ClassVar[bool] = True

    def levels(self) -> list[Level]:
        return [Level(REFERENCE)]

    @property
    def share_s(self) -> float:
        """Each variant's share of the search's time."""
        return self.time_s / max(1, self.variants)

    @property
    def concurrent(self) -> bool:
        return True

    def plan(self, slo: Slo) -> SearchPlan:
        return SearchPlan(self.axis, self.time_s, self.variants, self.max_probes, need(bool(slo)),
                          bool(slo.relative), self.axis == "rate" and not self.start)

    def schedule(self, stops: tuple[StopRule, ...] = ()) -> Schedule:
        return SearchSchedule(self, stops)

    def plan_line(self, stops: tuple[StopRule, ...] = ()) -> str | None:
        return self.plan(slo_of(stops)).line()

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "search", "search": self.axis, "max_probes": self.max_probes,
                "tolerance": self.tolerance, "arrival": self.arrival, "arrival_seed": self.arrival_seed,
                "search_start": self.start, "search_time_s": self.time_s, "search_variants": self.variants}


def slo_of(stops: tuple[StopRule, ...]) -> Slo:
    rule = next((r for r in stops if isinstance(r, SloBreached)), None)
    return rule.slo if rule is not None else Slo()


def stopped_by(levels: int, plan: SearchPlan) -> str:
    """What ended a search whose bracket did not close, from the levels it used: its budget, or time."""
    return "budget" if levels >= plan.probes else "time"


class SearchSchedule(Schedule):
    """A search's levels, each chosen from the outcome of the last (one variant at a time)."""

    def __init__(self, p: Search, stops: tuple[StopRule, ...]) -> None:
        self.p, self.stops = p, stops
        self.slo = slo_of(stops)
        self.plan = p.plan(self.slo)
        self.taken: set[str] = set()
        self.deadline: float | None = None
        self.searches: dict[str, Bisection] = {}
        self.results: dict[str, Frontier] = {}
        self.pace: dict[str, float] = {}  # the most requests/s a level finished: how long the next will take
        self.tail_s: dict[str, float] = {}  # the last level's median E2E: the drain after its last send
        self.used: dict[str, int] = {}
        self.next: Level | None = self._first()

    def _name(self, name: str) -> str:
        self.taken.add(name)
        return name

    def _first(self) -> Level:
        if self.slo.relative:
            return Level(self._name(REFERENCE))
        if self.p.axis == "rate" and not self.p.start:
            return Level(self._name(BURST), CAL_CONCURRENCY, requests=CAL_REQUESTS)
        return self._level(self.p.start or 1.0)

    def _level(self, load: float) -> Level:
        name = self._name(probe_name(self.p.axis, load, self.taken))
        if self.p.axis == "rate":
            load = float(f"{load:.4g}")  # the load its name says: the report reads it back from there
            return Level(name, rate=load, arrival=self.p.arrival, arrival_seed=self.p.arrival_seed,
                         requests=rate_requests(load, self.plan.probe_s, self.plan.need))
        return Level(name, int(load), requests=closed_requests(int(load), self.plan.need))

    def __next__(self) -> Level:
        if self.next is None:
            raise StopIteration
        if self.deadline is None:  # the variant's share of the time starts with its first level
            self.deadline = time.monotonic() + self.plan.share_s
        level, self.next = self.next, None
        return replace(level, deadline=self.deadline)  # past it, nothing more is sent: the bound holds

    def estimate_s(self, variant: str, level: Level) -> float | None:
        """How long a level will take: its arrivals at the rate the server can finish them (never
        faster than the fastest seen), then its last request's E2E; None before anything was seen."""
        x, n = self.pace.get(variant), level.requests or 0
        if level.rate is not None:
            return n / min(level.rate, x or level.rate) + self.tail_s.get(variant, 0.0)
        return n / x + self.tail_s.get(variant, 0.0) if x else None

    def _bisection(self, start: float, ceiling: float | None = None) -> Bisection:
        spent = self.plan.before + (1 if self.slo.relative and self.p.axis == "concurrency"
                                    and not reference_is_probe(self.p.axis, self.slo) else 0)
        return Bisection(self.p.axis, start, self.plan.probes, self.p.tolerance, spent=spent, ceiling=ceiling)

    def observe(self, variant: str, level: Level, o: LevelOutcome) -> list[str]:
        said: list[str] = []
        self.used[variant] = self.used.get(variant, 0) + 1
        x = throughput(o) or (o.n / o.wall_s if o.n and o.wall_s else None)
        if x:
            self.pace[variant] = max(self.pace.get(variant, 0.0), x)
        if (tail := percentile([p.end - p.sent for p in o.series], 50)) is not None:
            self.tail_s[variant] = tail / 1000.0
        b = self.searches.get(variant)
        probe = True
        if level.name == BURST:
            probe = False
            if not x:
                self.results[variant] = Frontier(self.p.axis, None, None, None)
                return [f"throughput burst: {steady(o)}: it finished no request, so the search has no rate to "
                        "start from"]
            b = self.searches[variant] = self._bisection(CAL_START * x, ceiling=x)
            n = rate_requests(CAL_START * x, self.plan.probe_s, self.plan.need)
            said.append(f"throughput burst ({CAL_CONCURRENCY} in flight): {steady(o)}; it finished {x:.3g}/s: the "
                        f"first probe offers {CAL_START * x:.3g}/s, {n} requests over at least {self.plan.probe_s:.0f} s")
        elif level.name == REFERENCE and self.slo.relative and b is None:
            said.append(f"reference {level.name}: {steady(o)}")
            if self.p.axis == "rate":
                self.next = self._level(self.p.start) if self.p.start else \
                    Level(self._name(BURST), CAL_CONCURRENCY, requests=CAL_REQUESTS)
                if self.p.start:
                    self.searches[variant] = self._bisection(self.p.start)
                return said
            b = self.searches[variant] = self._bisection(1.0)
            probe = reference_is_probe(self.p.axis, self.slo)
        if b is None:
            b = self.searches[variant] = self._bisection(self.p.start or 1.0)
        if probe:
            load = level.rate if level.rate is not None else float(level.concurrency)
            p = probe_verdict(self.stops, load, o, level.name, level_need(level.name, self.p.axis, self.slo),
                              level.open_loop)
            b.add(p)
            held = f", up to {p.in_flight} in flight" if p.in_flight is not None else ""
            verdict = "meets the SLOs" if p.passed else "is too small to judge" if p.inconclusive else "fails"
            said.append(f"probe {level.name}: {verdict} ({steady(o)}{held})"
                        + (f": {p.why}" if p.why else ""))
        return said + self._advance(variant, b)

    def _advance(self, variant: str, b: Bisection) -> list[str]:
        said = []
        nxt = b.next_load()
        stopped = "budget" if nxt is None and b.max_probes - b.spent - len(b.probes) <= 0 else None
        if nxt is not None:
            lv = self._level(nxt)
            est = self.estimate_s(variant, lv)
            left = (self.deadline or time.monotonic()) - time.monotonic()
            if left <= 0 or (est is not None and est > left):
                said.append(f"next probe {lv.name} ({lv.requests} requests, about {dur(est)}) does not fit the "
                            f"{dur(max(left, 0.0))} left of its {dur(self.plan.share_s)}")
                stopped = "time"
            else:
                self.next = lv
        if self.next is None:
            f = self.results[variant] = frontier(self.p.axis, b.probes, self.p.tolerance, stopped)
            said.append(f.line(variant, self.slo.text()))
        return said


def plan_of(load: dict[str, Any]) -> SearchPlan:
    """A search run's plan again from its load record (`Search.record`)."""
    p = Search(load.get("search") or "rate", int(load.get("max_probes") or 8), float(load.get("tolerance") or 0.1),
               start=load.get("search_start"), time_s=float(load.get("search_time_s") or DEFAULT_SEARCH_TIME_S),
               variants=int(load.get("search_variants") or 1))
    return p.plan(Slo.from_record(load))
