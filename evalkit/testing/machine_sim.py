"""A machine whose background load moves while a run is sent, on a virtual clock: for proving
what the order variants share time in (`execution/order.py`) and the machine check
(`reporting/machine.py`) do to the latency verdicts at the margin (issue 47; the driver that
takes the real sending order and the real verdicts is benchmarks/machine_load_sim.py, the proof
tests/test_machine_sim.py, the table docs/verdicts.md "Paired in time").

Requests go one at a time in the order they are given (a `Work` iterator's), each taking

    latency = case base x variant factor x (1 + k · load(t)) x noise

with t the virtual clock at its send, advanced by each latency: case bases right-skewed
(lognormal, 0.4–4 s), the candidate's factor the true ratio, k the latency one core of foreign
load adds (`Machine`), noise a unit-mean lognormal per request. ``load(t)``, in cores
(`BACKGROUNDS`): none; a step at a random moment; a step (up, or a small one, or down) at the
candidate's first request, the adversarial case of the issue; a linear ramp; on/off bursts of
random length; a slow drift. The load sampler is simulated too: one sample a second of foreign
CPU (the load over that second, plus a little background and sampling noise), the rows of
`env_samples`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

BACKGROUNDS = ("none", "step", "step_at_candidate", "drop_at_candidate", "small_step_at_candidate", "ramp", "bursts",
               "drift")
AMPLITUDE = (1.0, 2.0)  # cores a scenario's load reaches (drawn per run): +30 to +60 % latency at k 0.3
SMALL = (0.3, 0.7)  # a step under the machine check's bar on 8 cores (0.8): +9 to +21 %
BASE_S = (0.4, 4.0)  # case base latencies: a lognormal with these at ±2 sigma, clipped to them
GAP_MS = 5.0  # between one answer and the next send


@dataclass(frozen=True)
class Machine:
    """How the machine turns load into latency, and how its sampler sees the load."""

    k: float = 0.3  # latency added per core of foreign load (one core: +30 %)
    host_cores: int = 8  # the host row's threads: the machine check's bar is max(0.25, 10 % of them) cores
    noise_sigma: float = 0.10  # per-request lognormal noise (unit mean)
    background: float = 0.05  # foreign CPU the sampler sees with no load at all (cores)
    sample_sd: float = 0.05  # the sampler's noise (cores)


@dataclass
class Background:
    """load(t) in cores, t in seconds on the run's clock. ``horizon`` is the run's length without
    load (a ramp spans it; a random step falls inside it)."""

    kind: str
    horizon: float
    rng: random.Random
    amplitude: float = 0.0
    start: float | None = None  # a step's moment (set at the candidate's first send for the *_at_candidate kinds)
    bursts: list[tuple[float, float]] = field(default_factory=list)  # (on, off) periods
    period: float = 1.0
    phase: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in BACKGROUNDS:
            raise ValueError(f"unknown background {self.kind!r} (known: {', '.join(BACKGROUNDS)})")
        lo, hi = SMALL if self.kind.startswith("small") else AMPLITUDE
        self.amplitude = 0.0 if self.kind == "none" else self.rng.uniform(lo, hi)
        if self.kind == "step":
            self.start = self.rng.uniform(0.0, self.horizon)
        elif self.kind == "bursts":  # on ~ 5-40 s, off ~ 10-80 s, until well past the horizon
            t = self.rng.uniform(0.0, 60.0)
            while t < 3 * self.horizon + 60.0:
                on = self.rng.uniform(5.0, 40.0)
                self.bursts.append((t, t + on))
                t += on + self.rng.uniform(10.0, 80.0)
        elif self.kind == "drift":  # one slow swing: a period of 1-3 horizons, a random phase
            self.period = self.horizon * self.rng.uniform(1.0, 3.0)
            self.phase = self.rng.uniform(0.0, 2 * math.pi)

    def sent(self, variant: str, candidate: str, t: float) -> None:
        """A request is sent at t: the *_at_candidate steps happen at the candidate's first."""
        if variant == candidate and self.start is None and self.kind.endswith("_at_candidate"):
            self.start = t

    def at(self, t: float) -> float:
        a, k = self.amplitude, self.kind
        if k == "none":
            return 0.0
        if k == "drop_at_candidate":
            return a if self.start is None or t < self.start else 0.0
        if k in ("step", "step_at_candidate", "small_step_at_candidate"):
            return a if self.start is not None and t >= self.start else 0.0
        if k == "ramp":
            return a * min(1.0, max(0.0, t / self.horizon))
        if k == "bursts":
            return a if any(on <= t < off for on, off in self.bursts) else 0.0
        return a * (1 - math.cos(2 * math.pi * t / self.period + self.phase)) / 2  # drift

    def over(self, t0: float, t1: float, points: int = 8) -> float:
        """The mean load over [t0, t1] (what a sampler sees over a second)."""
        return sum(self.at(t0 + (t1 - t0) * (j + 0.5) / points) for j in range(points)) / points


@dataclass
class Sim:
    """One simulated run: request rows as the ledger keeps them, the sampler's rows, its background."""

    rows: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    background: Background
    duration_ms: float


def case_bases(case_ids: Iterable[str], rng: random.Random) -> dict[str, float]:
    """Each case's base latency in ms: lognormal, 0.4 and 4 s at ±2 sigma, clipped to them."""
    lo, hi = (math.log(x) for x in BASE_S)
    mu, sigma = (lo + hi) / 2, (hi - lo) / 4
    return {c: 1000.0 * min(BASE_S[1], max(BASE_S[0], rng.lognormvariate(mu, sigma))) for c in case_ids}


def _field(item: Any, name: str) -> Any:
    if isinstance(item, dict):
        return item.get(name)
    return getattr(item, name, None)


def _case_id(item: Any) -> str:
    case = _field(item, "case")
    return str(case.id if case is not None else _field(item, "case_id"))


def simulate(items: Iterable[Any], background: str, ratio: float, seed: int, *, candidate: str = "cand",
             machine: Machine = Machine(), run_id: str = "sim",
             horizon_of: Callable[[float], float] | None = None) -> Sim:
    """Send ``items`` (`WorkItem`s, or dicts with variant, case_id, repeat, order_block,
    order_position) one at a time on a virtual clock under a background load; ``ratio`` is the
    candidate's true latency over the baseline's. Seeded: the same seed gives the same cases,
    noise and load whatever the order, so orders are compared on the same draws."""
    items = list(items)
    rng = random.Random(seed)
    bases = case_bases(dict.fromkeys(_case_id(it) for it in items), rng)
    no_load = sum(bases[_case_id(it)] * (ratio if _field(it, "variant") == candidate else 1.0) + GAP_MS
                  for it in items) / 1000.0
    bg = Background(background, horizon_of(no_load) if horizon_of else no_load, random.Random(rng.random()))
    noise = random.Random(rng.random())  # per request, drawn in the order sent
    mean_shift = -machine.noise_sigma ** 2 / 2
    rows: list[dict[str, Any]] = []
    t_ms = 0.0
    for seq, it in enumerate(items, start=1):
        v = _field(it, "variant")
        bg.sent(v, candidate, t_ms / 1000.0)
        lat = bases[_case_id(it)] * (ratio if v == candidate else 1.0) * (1 + machine.k * bg.at(t_ms / 1000.0)) \
            * noise.lognormvariate(mean_shift, machine.noise_sigma)
        rows.append({"run_id": run_id, "variant": v, "case_id": _case_id(it), "repeat": _field(it, "repeat"),
                     "seq": seq, "is_warmup": 0, "final": 1, "level": "main", "concurrency": 1, "error_class": None,
                     "e2e_ms": lat, "ttft_ms": 0.08 * lat, "tpot_ms": 0.92 * lat / 100, "itl_mean_ms": 0.92 * lat / 100,
                     "mono_start_ms": t_ms, "order_block": _field(it, "order_block"),
                     "order_position": _field(it, "order_position")})
        t_ms += lat + GAP_MS
    return Sim(rows, sampled(bg, t_ms, machine, random.Random(rng.random()), run_id), bg, t_ms)


def sampled(bg: Background, until_ms: float, machine: Machine, rng: random.Random, run_id: str) -> list[dict[str, Any]]:
    """The sampler's rows: one a second to past the run's end, each over the second before it."""
    out = []
    for j in range(1, int(until_ms // 1000) + 2):
        t = float(j)
        cpu = max(0.0, machine.background + bg.over(t - 1.0, t) + rng.gauss(0.0, machine.sample_sd))
        out.append({"run_id": run_id, "t_ms": 1000.0 * t, "span_ms": 1000.0, "ts": f"sim+{j}s", "foreign_cpu": cpu,
                    "steal": 0.0, "iowait": 0.0, "variant_active": None})
    return out


# what a verdict at a true difference gets wrong (docs/verdicts.md): at the margin any claim
# (undecided, the machine check's, and inconclusive are not claims); at no difference, better or
# worse than the margin
WRONG_AT_MARGIN = frozenset({"superior", "non-inferior", "inferior"})
WRONG_AT_ZERO = frozenset({"superior", "inferior"})


def wrong(verdict: str, at_margin: bool) -> bool:
    return verdict in (WRONG_AT_MARGIN if at_margin else WRONG_AT_ZERO)
