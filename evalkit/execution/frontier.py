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

    @property
    def oversaturated(self) -> bool:
        return bool(self.signals)


@dataclass
class Frontier:
    """A variant's answer: ``best`` (None: not even the lowest load passed), the interval
    [``lo``, ``hi``] (``hi`` None: no probe failed, the frontier is above the highest tried)."""

    axis: str
    best: float | None
    lo: float | None
    hi: float | None
    probes: list[Probe] = field(default_factory=list)
    converged: bool = False
    first_oversaturated: Probe | None = None

    def unit(self, x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:.3g} req/s" if self.axis == "rate" else f"{x:.0f} in flight"

    def line(self, variant: str, slo: str) -> str:
        n = len(self.probes)
        if self.best is None:
            return f"frontier {variant}: no load met {slo} (lowest tried {self.unit(min(p.load for p in self.probes))}, " \
                   f"{n} probes)" if self.probes else f"frontier {variant}: not probed"
        hi = self.unit(self.hi) if self.hi is not None else "above the highest tried"
        f = self.first_oversaturated
        over = f"; first over-saturated level {f.level or self.unit(f.load)} ({', '.join(f.signals)})" if f else ""
        return (f"frontier {variant}: sustains {self.unit(self.best)} at {slo} [interval {self.unit(self.lo)} .. {hi}], "
                f"{n} loaded probes{'' if self.converged else ' (budget spent before the bracket closed)'}{over}")

    def record(self) -> dict[str, Any]:
        f = self.first_oversaturated
        return {"axis": self.axis, "best": self.best, "lo": self.lo, "hi": self.hi, "converged": self.converged,
                "first_oversaturated": f.level if f else None,
                "probes": [{"level": p.level, "load": p.load, "passed": p.passed, "why": p.why, "achieved": p.achieved,
                            "signals": list(p.signals)} for p in self.probes]}


def frontier(axis: str, probes: list[Probe], tolerance: float = 0.1) -> Frontier:
    """The answer so far: the highest load that passed every time, below the lowest that failed."""
    failed = [p.load for p in probes if not p.passed]
    hi = min(failed) if failed else None
    ever_failed = set(failed)
    ok = [p.load for p in probes if p.passed and p.load not in ever_failed and (hi is None or p.load < hi)]
    lo = max(ok) if ok else None
    over = [p for p in probes if p.oversaturated]
    return Frontier(axis, lo, lo, hi, list(probes), closed(axis, lo, hi, tolerance),
                    min(over, key=lambda p: p.load) if over else None)


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
    spent: int = 0  # probes used before the search (the unloaded reference, for a rate search)
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
        counts: dict[float, int] = {}
        for p in self.probes:
            counts[p.load] = counts.get(p.load, 0) + 1
        knee_again = lo is not None and counts.get(lo, 0) < 2
        if f.converged or (left == 1 and knee_again):
            return lo if knee_again else None  # the knee once more: the answer carries an interval
        if hi is None:  # still climbing
            assert lo is not None
            return self._round(lo * (2.0 if self.axis == "concurrency" else self.growth))
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
    """a's frontier over b's, with the interval the two brackets allow: (point, low, high); high
    None when a's bracket has no top (a never failed)."""
    if not a.best or not b.best or not b.lo:
        return None
    low = a.lo / b.hi if (a.lo and b.hi) else 0.0
    high = a.hi / b.lo if a.hi else None
    return a.best / b.best, low, high


def ratio_line(name: str, base: str, a: Frontier, b: Frontier) -> str | None:
    r = ratio(a, b)
    if r is None:
        return None
    point, low, high = r
    top = f"{high:.2f}" if high is not None else "open (no probe of it failed)"
    return f"frontier {name} vs {base}: {point:.2f}x [interval {low:.2f} .. {top}]"
