"""The capacity frontier: the highest load (requests/s, or requests in flight) a variant sustains
at its SLOs, found by probing. Pure arithmetic on probe verdicts, no I/O: the search pattern
(`patterns.Search`) asks it for the next load after each probe, and the report derives the same
answer again from the ledger's levels.

Method: bracket (the load doubles from a safe start until a probe fails, or halves until one
passes), then bisect (geometric midpoints; after an over-saturated probe, just under the rate the
server actually finished at, which is its throughput ceiling), until the bracket is within the
tolerance; then the knee (the highest passing load) is probed again. The answer is the highest
load that passed every time it was probed, below the lowest load that failed; the two are the
interval the true frontier lies in (at the probes' noise: a knee that fails when probed again
moves the answer down and widens the interval).

What is claimed is what the probes reached, never the nominal level alone: a concurrency no higher
than the most requests its probes had in flight at once, a rate no higher than the rate the server
finished them at (`Frontier.claim`); a claim capped below its level says so and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Probe:
    load: float
    passed: bool
    why: str | None = None  # the SLO or over-saturation that failed it
    achieved: float | None = None  # the rate the server finished requests at (an open loop)
    signals: tuple[str, ...] = ()  # the over-saturation signals that fired (queue, kv, rate)
    level: str = ""  # its level in the ledger
    n: int | None = None  # requests it sent
    duration_s: float | None = None  # how long they took (first send to last end)
    in_flight: int | None = None  # the most in flight at once (the ledger's rows)
    in_flight_mean: float | None = None
    throughput: float | None = None  # requests/s finished over its middle (a closed loop's too)
    inconclusive: bool = False  # too small to judge (cut by the time bound, too short a rate): no pass, no failure

    @property
    def oversaturated(self) -> bool:
        return bool(self.signals)

    def reached(self, axis: str) -> float | None:
        """What the probe actually held: its peak in flight (concurrency), the rate it finished at (rate)."""
        return float(self.in_flight) if axis == "concurrency" and self.in_flight is not None else \
            self.achieved if axis == "rate" else None

    def said(self) -> str:
        """Its evidence in one clause: `120 requests over 13.2 s, 9.05/s finished, up to 5 in flight`."""
        parts = [f"{self.n} requests" + (f" over {self.duration_s:.1f} s" if self.duration_s is not None else "")] \
            if self.n is not None else []
        rate = self.achieved or self.throughput
        if rate:
            parts.append(f"{rate:.3g}/s finished")
        if self.in_flight is not None:
            parts.append(f"up to {self.in_flight} in flight")
        return ", ".join(parts)


STOPS = {"time": "stopped at the time bound", "budget": "the probe budget was spent"}


@dataclass
class Frontier:
    """A variant's answer: ``best`` (None: not even the lowest load passed), the interval
    [``lo``, ``hi``] (``hi`` None: no probe failed, the frontier is above the highest tried), in
    probed (nominal) loads; `claim` is what the probes at ``best`` reached, never more than ``best``.
    ``stopped``: what ended a search before its bracket closed (`STOPS`)."""

    axis: str
    best: float | None
    lo: float | None
    hi: float | None
    probes: list[Probe] = field(default_factory=list)
    converged: bool = False
    first_oversaturated: Probe | None = None
    stopped: str | None = None

    def unit(self, x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:.3g} req/s" if self.axis == "rate" else f"{x:.0f} in flight"

    @property
    def knee(self) -> list[Probe]:
        return [p for p in self.probes if p.passed and p.load == self.best]

    @property
    def claim(self) -> float | None:
        """The answer as reached: the lowest of ``best`` and what each of its passing probes held."""
        if self.best is None:
            return None
        reached = [r for p in self.knee if (r := p.reached(self.axis)) is not None]
        return min([self.best, *reached])

    @property
    def capped(self) -> bool:
        """A concurrency its probes never had in flight (a rate claim is the finished rate: not a cap)."""
        c = self.claim
        return self.axis == "concurrency" and c is not None and self.best is not None and c < self.best

    def cap_why(self) -> str:
        p = min(self.knee, key=lambda p: p.reached(self.axis) or 0.0)
        short = f": it sent {p.n} requests" if p.n is not None and p.n <= (p.in_flight or 0) else ""
        return f"its probes never had more than {self.unit(self.claim)} ({p.level or self.unit(p.load)}{short})"

    def line(self, variant: str, slo: str) -> str:
        n = len(self.probes)
        stop = STOPS.get(self.stopped or "", "")
        if self.best is None:
            if not self.probes:
                return f"frontier {variant}: not probed"
            if all(p.inconclusive for p in self.probes):
                return f"frontier {variant}: no probe was big enough to judge {slo} ({self.probes[0].why}, {n} probes)"
            return f"frontier {variant}: no load met {slo} (lowest tried {self.unit(min(p.load for p in self.probes))}, " \
                   f"{n} probes)"
        claim = self.unit(self.claim)
        f = self.first_oversaturated
        over = f"; first over-saturated level {f.level or self.unit(f.load)} ({', '.join(f.signals)})" if f else ""
        knee = self.knee[-1]
        evidence = f"; its probe {knee.level or self.unit(knee.load)}: {knee.said()}" if knee.said() else ""
        capped = f": {self.cap_why()}" if self.capped else ""
        if self.hi is None:  # open above: the claim is what the highest passing probes held
            held = capped or (f": no probe failed, and its probes never had more than {claim}" if self.axis == "concurrency"
                              else f": no probe failed, the fastest finished {claim}")
            return (f"frontier {variant}: sustains at least {claim} at {slo}{held} ({stop or 'the search ended'}), "
                    f"{n} loaded probes{evidence}")
        if capped:
            return (f"frontier {variant}: sustains at least {claim} at {slo}{capped}; first failed at "
                    f"{self.unit(self.hi)}, {n} loaded probes{evidence}{over}")
        if not self.converged:
            what = "max rate" if self.axis == "rate" else "max concurrency"
            top = f"{self.hi:.3g} req/s" if self.axis == "rate" else f"{self.hi:.0f} in flight"
            low = f"{self.claim:.3g}" if self.axis == "rate" else f"{self.claim:.0f}"
            return (f"frontier {variant}: {what} between {low} and {top} at {slo}: "
                    f"{stop or 'the bracket did not close'}, {n} loaded probes{evidence}{over}")
        return (f"frontier {variant}: sustains {claim} at {slo} [interval {claim} .. {self.unit(self.hi)}], "
                f"{n} loaded probes{evidence}{over}")

    def record(self) -> dict[str, Any]:
        f = self.first_oversaturated
        return {"axis": self.axis, "best": self.best, "claim": self.claim, "lo": self.lo, "hi": self.hi,
                "converged": self.converged, "stopped": self.stopped,
                "first_oversaturated": f.level if f else None,
                "probes": [{"level": p.level, "load": p.load, "passed": p.passed, "why": p.why, "achieved": p.achieved,
                            "signals": list(p.signals), "n": p.n, "duration_s": p.duration_s,
                            "in_flight": p.in_flight, "throughput": p.throughput} for p in self.probes]}


def frontier(axis: str, probes: list[Probe], tolerance: float = 0.1, stopped: str | None = None) -> Frontier:
    """The answer so far: the highest load that passed every time, below the lowest that failed."""
    failed = [p.load for p in probes if not p.passed and not p.inconclusive]
    hi = min(failed) if failed else None
    ever_failed = set(failed)
    ok = [p.load for p in probes if p.passed and p.load not in ever_failed and (hi is None or p.load < hi)]
    lo = max(ok) if ok else None
    over = [p for p in probes if p.oversaturated]
    done = closed(axis, lo, hi, tolerance)
    return Frontier(axis, lo, lo, hi, list(probes), done, min(over, key=lambda p: p.load) if over else None,
                    None if done else stopped)


def closed(axis: str, lo: float | None, hi: float | None, tolerance: float) -> bool:
    if lo is None or hi is None:
        return False
    return hi - lo <= 1 if axis == "concurrency" else hi <= lo * (1 + tolerance)


@dataclass
class Bisection:
    """Chooses each next probe load from the probes so far (`next_load`), within a probe budget
    (`max_probes`, counting those already spent elsewhere, e.g. an unloaded reference)."""

    axis: str  # "rate" or "concurrency"
    start: float
    max_probes: int = 8
    tolerance: float = 0.1
    growth: float = 4.0  # a rate search climbs fast: its first over-saturated probe shows the ceiling
    spent: int = 0  # levels used before the search (the unloaded reference, a rate search's throughput burst)
    ceiling: float | None = None  # a rate search: the requests/s a burst finished (above it the climb is slow)
    probes: list[Probe] = field(default_factory=list)

    def add(self, probe: Probe) -> None:
        self.probes.append(probe)

    def result(self) -> Frontier:
        return frontier(self.axis, self.probes, self.tolerance)

    def _round(self, x: float) -> float:
        return float(max(1, round(x))) if self.axis == "concurrency" else x

    def next_load(self) -> float | None:
        left = self.max_probes - self.spent - len(self.probes)
        if left <= 0:
            return None
        f = self.result()
        lo, hi = f.lo, f.hi
        if not self.probes:
            return self._round(self.start)
        if lo is None and hi is None:  # nothing judged yet (a probe too small): nothing to go on
            return None
        counts: dict[float, int] = {}
        for p in self.probes:
            counts[p.load] = counts.get(p.load, 0) + 1
        knee_again = lo is not None and counts.get(lo, 0) < 2
        if f.converged or (left == 1 and knee_again):
            return lo if knee_again else None  # the knee once more: the answer carries an interval
        if hi is None:  # still climbing
            assert lo is not None
            if self.axis == "concurrency":
                return self._round(lo * 2.0)
            if self.ceiling:  # the burst's throughput: just above it, then doubling past it
                return min(lo * self.growth, 1.25 * self.ceiling) if lo < self.ceiling else lo * 2.0
            return lo * self.growth
        if lo is None:  # nothing passed yet: step down (under what an over-saturated probe finished at)
            last = self.probes[-1]
            aim = 0.9 * last.achieved if last.oversaturated and last.achieved else hi / self.growth
            nxt = self._round(min(aim, hi / 1.05))
            floor = 1.0 if self.axis == "concurrency" else self.start / self.growth ** 4
            return nxt if nxt < hi and nxt >= floor else None
        if self.axis == "concurrency":
            mid = float((int(lo) + int(hi)) // 2)
            return mid if lo < mid < hi else None
        mid = math.sqrt(lo * hi)
        last = next((p for p in reversed(self.probes) if not p.passed and p.load == hi), None)
        if last is not None and last.oversaturated and last.achieved:
            # an over-saturated probe finished requests at the server's ceiling: the frontier is
            # near or under it, so bisect up to just above it rather than up to the failed load
            top = min(hi, 1.1 * last.achieved)
            if top > lo * (1 + self.tolerance / 4):
                mid = math.sqrt(lo * top)
        return mid


def ratio(a: Frontier, b: Frontier) -> tuple[float, float, float | None] | None:
    """a's frontier over b's (what each reached), with the interval the two brackets allow:
    (point, low, high); high None when a's bracket has no top (a never failed)."""
    ca, cb = a.claim, b.claim
    if not ca or not cb:
        return None
    low = ca / b.hi if b.hi else 0.0
    high = a.hi / cb if a.hi else None
    return ca / cb, low, high


def ratio_line(name: str, base: str, a: Frontier, b: Frontier) -> str | None:
    r = ratio(a, b)
    if r is None:
        return None
    point, low, high = r
    top = f"{high:.2f}" if high is not None else "open (no probe of it failed)"
    return f"frontier {name} vs {base}: {point:.2f}x [interval {low:.2f} .. {top}]"
