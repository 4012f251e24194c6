"""How big a search's probes are, and what its time bound allows (docs/capacity.md). A probe is
sized by what its verdict needs and by the level it must fill, never by the dataset: it cycles the
cases when it needs more requests than there are (repeats of a case are fine for a capacity probe).

- **A p99 needs `P99_NEED` = 100 requests.** The p99 of n requests is (nearly) their
  ⌈0.99 n⌉-th smallest: under 100 it is their maximum, not a 99th percentile. At 100 it is the
  99th smallest, which lies between the true p95 and p99.6 nine times in ten (that order statistic
  of a continuous latency sits at a Beta(99, 2) quantile): the tolerance a probe's verdict has.
- **Without an SLO, `TREND_NEED` = 30**: the over-saturation trend compares the first and last
  thirds of a probe (10 requests each) and a finish rate is a slope over the middle 80 %.
- **A closed loop of c** sends at least `FILL` × c = 4c requests: c are in flight until the last c
  are sent, about 3/4 of the probe, and the probe records how many it actually held.
- **An open loop at r** sends at least max(need, r × `probe_s`) arrivals: `probe_s` (5 to 30 s) is
  its share of the time bound, so a probe lasts long enough for a queue to build when r is above
  what the server finishes (at (1 + e) × the ceiling μ a probe of d seconds queues e·μ·d requests).
  A rate probe shorter than `MIN_PROBE_S` or with fewer than `MIN_ARRIVALS` arrivals is too short
  to measure its rate: it is never a pass.
- **A rate search's first rate** comes from a throughput burst (`CAL_CONCURRENCY` = 16 in flight,
  48 requests, closed loop): the rate the server finished them at is its ceiling at 16 streams;
  the first probe is 3/4 of it, the climb goes to 1.25x it, then doubles past it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError

P99_NEED = 100
TREND_NEED = 30
FILL = 4
MIN_PROBE_S = 5.0
MAX_PROBE_S = 30.0
MIN_ARRIVALS = 30
CAL_CONCURRENCY = 16
CAL_REQUESTS = 3 * CAL_CONCURRENCY  # ramp in, full, drain: the middle third at 16 in flight
CAL_START = 0.75  # the first rate probe, as a share of the burst's throughput
DEFAULT_SEARCH_TIME_S = 600.0


def dur(seconds: float) -> str:
    """`4 min 30 s`, `45 s`."""
    s = int(round(seconds))
    return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "") if s >= 60 else f"{s} s"


def need(slo_given: bool) -> int:
    """Requests a probe's verdict needs: a p99 (every search SLO is one), else the trend's."""
    return P99_NEED if slo_given else TREND_NEED


def rate_requests(rate: float, probe_s: float, need_n: int) -> int:
    """An open-loop probe's arrivals: the statistic's need, and at least `probe_s` of them."""
    return max(need_n, MIN_ARRIVALS, math.ceil(rate * probe_s) + 1)  # n arrivals span (n - 1) gaps


def closed_requests(concurrency: int, need_n: int) -> int:
    """A closed-loop probe's requests: the statistic's need, and enough to fill its level."""
    return max(need_n, FILL * concurrency)


def too_short(n: int, wall_s: float | None) -> str | None:
    """Why an open-loop probe cannot measure its rate, or None."""
    if n < MIN_ARRIVALS or wall_s is None or wall_s < MIN_PROBE_S:
        return (f"too short to measure its rate ({n} arrivals over {wall_s or 0:.1f} s: a rate needs at least "
                f"{MIN_ARRIVALS} and {MIN_PROBE_S:g} s)")
    return None


@dataclass(frozen=True)
class SearchPlan:
    """What a search will do in its time: ``time_s`` for every variant together, shared equally;
    ``max_probes`` levels a variant at most (its reference and burst included)."""

    axis: str
    time_s: float
    variants: int
    max_probes: int
    need: int
    reference: bool  # a relative SLO: every case once, one at a time, first
    burst: bool  # a rate search: the throughput burst that sets its first rate

    @property
    def share_s(self) -> float:
        return self.time_s / max(1, self.variants)

    @property
    def before(self) -> int:
        """Levels before the first probe proper (a concurrency search's reference is its c=1 probe)."""
        return int(self.burst) + int(self.reference and self.axis == "rate")

    @property
    def probes(self) -> int:
        """Levels a variant may use: the budget, fewer when the time cannot hold that many."""
        return min(self.max_probes, int(self.share_s // MIN_PROBE_S))

    @property
    def probe_s(self) -> float:
        """How long an open-loop probe lasts at least: its share of the time, 5 to 30 s."""
        return min(MAX_PROBE_S, max(MIN_PROBE_S, self.share_s / max(1, self.probes)))

    def check(self, flag: str = "--search-time") -> None:
        least = self.before + 2  # a pass and a failure after what comes first
        if self.probes < least:
            raise UsageError(f"{flag} {self.time_s:g} s: {self.variants} variant(s) get {self.share_s:.0f} s each, "
                             f"too short for {least} levels of at least {MIN_PROBE_S:g} s: give at least "
                             f"{math.ceil(least * MIN_PROBE_S * self.variants)} s")

    def line(self) -> str:
        first = []
        if self.reference:
            first.append("the unloaded reference (every case once, one at a time)")
        if self.burst:
            first.append(f"a throughput burst ({CAL_REQUESTS} requests at {CAL_CONCURRENCY} in flight)")
        size = (f"at least {self.need} requests ({'a p99 needs 100' if self.need == P99_NEED else 'the trend needs 30'})"
                + (f" and {self.probe_s:.0f} s each at its rate" if self.axis == "rate" else ", and 4x its concurrency"))
        return (f"search {self.axis}: up to {self.probes} levels per variant ({', then '.join(first + ['probes'])}); "
                f"each probe {size}; at most about {dur(self.share_s)} per variant, {dur(self.time_s)} in all "
                "(--search-time)")
