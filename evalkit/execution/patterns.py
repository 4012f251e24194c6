"""Load patterns, one small type each (after GuideLLM's profiles): what a run sends and when. A
pattern is a list of load levels; a level is either a closed loop (N requests in flight, the next
sent when one finishes; 1 is sequential) or an open loop (arrivals at set times, whatever the
server does). The runner loops over a pattern's levels and asks the stop rules (`stops.py`)
whether to go on; it never asks which pattern it runs, so a new pattern is one type here.

- `Sequential`: one request at a time (the interactive setting of the study);
- `ClosedLoop(n)`: n in flight; with `sequential_pass` every case is sent at 1 first (quality under load);
- `OpenLoop(rate)`: arrivals from a seeded Poisson (or constant) process at rate/s, optionally capped;
- `Sweep(levels)`: closed-loop levels, climbing until a stop rule says the variant saturated;
- `TraceReplay(offsets)`: a recorded trace's arrivals at their (sped-up) offsets;
- `search.Search(axis)`: the capacity frontier: probes chosen one after another from the last
  outcome (`probing.py`, `frontier.py`), each sized to fill its level, within a time bound.

The runner walks a pattern's `schedule()`: its fixed levels, or, for an adaptive pattern, levels
chosen as the outcomes arrive (`Schedule.observe`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, ClassVar, Literal

from ..errors import UsageError
from .stops import LevelOutcome, StopRule

Arrival = Literal["poisson", "constant"]


def arrivals(rate: float, arrival: str, arrival_seed: int) -> Iterator[float]:
    """Scheduled send times in seconds from the start of the load, at `rate`/s, without end.
    Poisson: exponential gaps from a seeded generator (the same seed gives the same schedule)."""
    rng = random.Random(arrival_seed)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate) if arrival == "poisson" else 1.0 / rate


def arrival_offsets(n: int, rate: float, arrival: str, arrival_seed: int) -> list[float]:
    """The first n of `arrivals`."""
    return list(islice(arrivals(rate, arrival, arrival_seed), n))


@dataclass(frozen=True)
class Level:
    """One load level: a closed loop of ``concurrency`` (1: sequential), or an open loop of arrivals
    (``rate`` per second from a seeded process, or recorded ``offsets``), optionally capped at
    ``max_in_flight`` requests. ``requests``: a level sized by what it must show (a search's probe)
    sends that many, cycling the cases; otherwise every case and repeat once."""

    name: str
    concurrency: int = 1
    rate: float | None = None
    arrival: str = "poisson"
    arrival_seed: int = 0
    offsets: tuple[float, ...] | None = None
    max_in_flight: int | None = None
    requests: int | None = None  # this many per variant, the cases cycled (a search's probe); None: every case
    deadline: float | None = None  # time.monotonic() after which nothing more is sent (a search's time bound)

    @property
    def open_loop(self) -> bool:
        return self.rate is not None or self.offsets is not None

    @property
    def sequential(self) -> bool:
        return not self.open_loop and self.concurrency == 1

    def arrivals(self) -> Iterator[float]:
        """When each open-loop arrival is due (s from the level's start), in order, on demand."""
        if self.offsets is not None:
            return iter(self.offsets)
        assert self.rate is not None
        return arrivals(self.rate, self.arrival, self.arrival_seed)

    def schedule(self, n: int) -> list[float]:
        """The first n arrivals."""
        return list(islice(self.arrivals(), n))


class Schedule:
    """The levels the runner sends, one at a time; it tells each variant's outcome back
    (`observe`), which a fixed pattern ignores and an adaptive one chooses its next level from."""

    def __init__(self, levels: list[Level]) -> None:
        self._levels = iter(levels)

    def __iter__(self) -> Iterator[Level]:
        return self

    def __next__(self) -> Level:
        return next(self._levels)

    def observe(self, variant: str, level: Level, o: LevelOutcome) -> list[str]:
        """One variant's outcome of a level; returns what to say about it."""
        return []


class Pattern:
    """A load pattern: its levels in order, and the flat record the ledger keeps (`runs.load_json`)."""

    kind: ClassVar[str]
    saturates: ClassVar[bool] = False  # its levels climb until a saturation rule stops the variant
    adaptive: ClassVar[bool] = False  # its levels are chosen as outcomes arrive (`levels()`: the first only)

    def levels(self) -> list[Level]:
        raise NotImplementedError

    def schedule(self, stops: tuple[StopRule, ...] = ()) -> Schedule:
        """What the runner walks: the levels, told each outcome."""
        return Schedule(self.levels())

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def plan_line(self, stops: tuple[StopRule, ...] = ()) -> str | None:
        """What the pattern will do, said before anything is sent (a search's time and probes)."""
        return None

    @property
    def concurrent(self) -> bool:
        return any(not lv.sequential for lv in self.levels())


@dataclass(frozen=True)
class Sequential(Pattern):
    kind: ClassVar[str] = "sequential"

    def levels(self) -> list[Level]:
        return [Level("main")]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "sequential", "concurrency": 1}


@dataclass(frozen=True)
class ClosedLoop(Pattern):
    concurrency: int
    sequential_pass: bool = False  # every case at concurrency 1 first (quality under load compares them)
    kind: ClassVar[str] = "closed_loop"

    def levels(self) -> list[Level]:
        if self.sequential_pass and self.concurrency > 1:
            return [Level("c=1"), Level(f"c={self.concurrency}", self.concurrency)]
        return [Level("main", self.concurrency)]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "concurrency", "concurrency": self.concurrency,
                "sequential_pass": self.sequential_pass}


@dataclass(frozen=True)
class OpenLoop(Pattern):
    rate: float
    arrival: Arrival = "poisson"
    max_concurrency: int | None = None
    arrival_seed: int = 0
    kind: ClassVar[str] = "open_loop"

    def levels(self) -> list[Level]:
        return [Level("main", rate=self.rate, arrival=self.arrival, arrival_seed=self.arrival_seed,
                      max_in_flight=self.max_concurrency)]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "rate", "rate": self.rate, "arrival": self.arrival,
                "max_concurrency": self.max_concurrency, "arrival_seed": self.arrival_seed}


@dataclass(frozen=True)
class Sweep(Pattern):
    concurrencies: tuple[int, ...]
    kind: ClassVar[str] = "sweep"
    saturates: ClassVar[bool] = True

    def levels(self) -> list[Level]:
        return [Level(f"c={c}", c) for c in self.concurrencies]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "concurrency", "sweep": list(self.concurrencies)}


@dataclass(frozen=True)
class TraceReplay(Pattern):
    """A trace's arrivals at their recorded offsets (already sped up). The offsets are not stored
    with the run: a resume builds them again from the trace (runs.trace_json)."""

    offsets: tuple[float, ...]
    max_concurrency: int | None = None
    kind: ClassVar[str] = "trace"

    @property
    def rate(self) -> float:
        """The trace's mean arrival rate, for the estimate and the report's arrivals table."""
        return max(len(self.offsets) - 1, 1) / max(self.offsets[-1] if self.offsets else 0.0, 1e-3)

    def levels(self) -> list[Level]:
        return [Level("main", rate=self.rate, offsets=self.offsets, max_in_flight=self.max_concurrency)]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "rate", "rate": self.rate, "arrival": "trace",
                "max_concurrency": self.max_concurrency}


REFERENCE = "c=1"  # a search's unloaded reference level (and a concurrency search's first probe)
BURST = "burst"  # a rate search's throughput burst: where its first rate comes from, not a probe


def probe_name(axis: str, load: float, taken: set[str]) -> str:
    """A probe's level name (`r=3.7`, `c=4`); a load probed again gets `#2`."""
    base = f"r={load:.4g}" if axis == "rate" else f"c={int(load)}"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}#{k}"
    return name


def probe_load(level: str) -> tuple[str, float] | None:
    """('rate' | 'concurrency', load) from a probe's level name, or None."""
    head = level.split("#")[0]
    for prefix, axis in (("r=", "rate"), ("c=", "concurrency")):
        if head.startswith(prefix):
            try:
                return axis, float(head[2:])
            except ValueError:
                return None
    return None


def pattern_from_record(d: dict[str, Any], trace_offsets: list[float] | None = None) -> Pattern:
    """The pattern a run was started with, from its stored record (also a ledger written before
    patterns had a `kind`: its mode, sweep and rate). A kind this version does not know is an
    error, never a sequential run in disguise."""
    kind = d.get("kind")
    if kind is not None and kind not in ("trace", "sweep", "open_loop", "closed_loop", "sequential", "search"):
        raise UsageError(f"the run's load pattern '{kind}' is not one this evalkit knows: resume it with the "
                         "version that started it")
    if kind == "search":  # its next probe rests on outcomes in this process: it does not resume
        raise UsageError("a frontier search (--search) does not resume: start it again (its probes so far stay "
                         "in the ledger under the old run id)")
    if kind == "trace" or (kind is None and trace_offsets is not None):
        return TraceReplay(tuple(trace_offsets or ()), d.get("max_concurrency"))
    if kind == "sweep" or (kind is None and d.get("sweep")):
        return Sweep(tuple(d["sweep"]))
    if kind == "open_loop" or (kind is None and d.get("mode") == "rate"):
        return OpenLoop(float(d["rate"]), d.get("arrival") or "poisson", d.get("max_concurrency"),
                        int(d.get("arrival_seed") or 0))
    if kind == "closed_loop" or (kind is None and (d.get("concurrency") or 1) > 1):
        return ClosedLoop(int(d.get("concurrency") or 1), bool(d.get("sequential_pass")))
    return Sequential()
