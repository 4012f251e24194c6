"""Whether a verdict's two sides ran under measurably different machine load (issue 47): a
neighbour that starts between the baseline and the candidate reads as a model difference with a
confident interval. From the per-variant load summaries (`Ledger.env_load`) and, optionally, the
baseline's own series, `machine_moved` says in one line why the sides are not comparable, or None.

Causes, each against `MachineThresholds` (defaults and why: docs/measuring.md, "Machine load"):

- foreign CPU: the sides' mean foreign CPU differs by at least 0.25 cores and 10 % of the host's
  cores (a quarter core is what one busy neighbour thread costs a CPU-bound server on a small
  machine; on a large one the bar rises with the cores, where a quarter core is background);
- steal: the mean steal share differs by 0.10 or more (10 % steal is the usual cloud warning line:
  the hypervisor gave a tenth of every second to someone else);
- GPU throttling on one side only: throttled in at least 10 % of one side's samples, under half
  that on the other;
- a change point in the baseline's own series (its foreign CPU, or its per-request latency in
  send order): a CUSUM test at a 1 % false-alarm rate (`stats.changepoint`), and a shift large
  enough to matter (the foreign-CPU bar, or 20 % of the latency before it).

With variants alternating in time both sides see the same load: the means agree, and a step in
the baseline's series is one the candidate saw too. So change points count only when the sides
ran back to back (their spans overlap by less than half the shorter one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..stats.changepoint import MeanShift, mean_shift


@dataclass(frozen=True)
class SideLoad:
    """One variant's load while its requests were in flight (a row of `Ledger.env_load`)."""

    variant: str
    samples: int = 0
    foreign_cpu_mean: float | None = None
    foreign_cpu_p90: float | None = None
    foreign_cpu_max: float | None = None
    steal_mean: float | None = None
    steal_p90: float | None = None
    steal_max: float | None = None
    iowait_mean: float | None = None
    iowait_p90: float | None = None
    iowait_max: float | None = None
    gpu_samples: int = 0
    throttle_share: float | None = None
    first_ms: float | None = None  # the variant's first send and last end on the run's clock
    last_ms: float | None = None

    @classmethod
    def from_summary(cls, row: Mapping[str, Any]) -> SideLoad:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


@dataclass(frozen=True)
class BaseSeries:
    """The baseline's own series, in time order: foreign CPU over the samples its requests
    overlapped (`Ledger.env_series`), and/or the CUSUM test of its latency per request in send
    order (`Ledger.series_shift`, or `mean_shift` of the values: one request a point)."""

    foreign_cpu: Sequence[float] = ()
    latency: MeanShift | None = None
    latency_name: str = "E2E"


@dataclass(frozen=True)
class MachineThresholds:
    foreign_cpu_cores: float = 0.25  # |Δ mean foreign CPU| in cores, and ...
    foreign_cpu_host_share: float = 0.10  # ... at least this share of the host's cores
    steal: float = 0.10  # |Δ mean steal share|: 10 % steal is the cloud warning line
    throttle_share: float = 0.10  # one side throttled in this share of its samples, the other in under half of it
    min_samples: int = 3  # fewer samples on a side: nothing is said about it
    change_alpha: float = 0.01  # the change-point test's false-alarm rate (independent values)
    change_min_points: int = 20  # a shorter series is not tested (short correlated ones alarm too often)
    latency_shift: float = 0.20  # a latency step counts from 20 % of the level before it
    interleaved_overlap: float = 0.5  # spans overlapping this much of the shorter: the sides alternated


DEFAULT_THRESHOLDS = MachineThresholds()


def overlap(base: SideLoad, cand: SideLoad) -> float | None:
    """How much of the shorter side's span the other's covers (0: back to back), None if unknown."""
    if base.first_ms is None or base.last_ms is None or cand.first_ms is None or cand.last_ms is None:
        return None
    lo, hi = max(base.first_ms, cand.first_ms), min(base.last_ms, cand.last_ms)
    shorter = min(base.last_ms - base.first_ms, cand.last_ms - cand.first_ms)
    if shorter <= 0:  # a side of one instant: inside the other's span or not
        return 1.0 if lo <= hi else 0.0
    return max(0.0, hi - lo) / shorter


def _cpu_bar(t: MachineThresholds, host_cores: int | None) -> float:
    return max(t.foreign_cpu_cores, t.foreign_cpu_host_share * host_cores if host_cores else 0.0)


def _mean_causes(base: SideLoad, cand: SideLoad, t: MachineThresholds, host_cores: int | None) -> list[str]:
    out: list[str] = []
    if base.samples < t.min_samples or cand.samples < t.min_samples:
        return out
    b, c = base.foreign_cpu_mean, cand.foreign_cpu_mean
    if b is not None and c is not None and abs(c - b) >= _cpu_bar(t, host_cores):
        out.append(f"foreign CPU {b:.2f} → {c:.2f} cores while {cand.variant} ran")
    b, c = base.steal_mean, cand.steal_mean
    if b is not None and c is not None and abs(c - b) >= t.steal:
        out.append(f"steal {b:.0%} → {c:.0%} of CPU time while {cand.variant} ran")
    b, c = base.throttle_share, cand.throttle_share
    if b is not None and c is not None and min(base.gpu_samples, cand.gpu_samples) >= t.min_samples \
            and max(b, c) >= t.throttle_share and min(b, c) < t.throttle_share / 2:
        out.append(f"GPU throttled in {b:.0%} of {base.variant}'s samples, {c:.0%} of {cand.variant}'s")
    return out


def _step_causes(base: SideLoad, series: BaseSeries, t: MachineThresholds, host_cores: int | None) -> list[str]:
    out: list[str] = []
    if len(series.foreign_cpu) >= t.change_min_points:
        s = mean_shift(series.foreign_cpu)
        if s is not None and s.p_value <= t.change_alpha and abs(s.delta) >= _cpu_bar(t, host_cores):
            out.append(f"foreign CPU stepped {s.before:.2f} → {s.after:.2f} cores during {base.variant}'s run "
                       f"(CUSUM p={s.p_value:.2g})")
    s = series.latency
    if s is not None and s.n >= t.change_min_points and s.p_value <= t.change_alpha and s.before > 0 \
            and abs(s.delta) >= t.latency_shift * s.before:
        out.append(f"{base.variant}'s own {series.latency_name} stepped {s.before:.0f} → {s.after:.0f} ms "
                   f"during its run (CUSUM p={s.p_value:.2g})")
    return out


def machine_moved(base: SideLoad, cand: SideLoad, base_series: BaseSeries | None = None,
                  thresholds: MachineThresholds = DEFAULT_THRESHOLDS, host_cores: int | None = None) -> str | None:
    """One line naming why the sides ran under measurably different load, or None.
    ``host_cores``: the machine's logical CPUs (the run's host row), for the foreign-CPU bar."""
    causes = _mean_causes(base, cand, thresholds, host_cores)
    ov = overlap(base, cand)
    if base_series is not None and (ov is None or ov < thresholds.interleaved_overlap):
        causes += _step_causes(base, base_series, thresholds, host_cores)
    return "machine load changed: " + "; ".join(causes) if causes else None


def block_moved(rows: Sequence[Mapping[str, Any]], base: str, cand: str,
                thresholds: MachineThresholds = DEFAULT_THRESHOLDS, host_cores: int | None = None) -> str | None:
    """One line naming the chunk of the alternation whose two sides ran under measurably different
    load (`Ledger.env_by_block` rows), or None. With one server up at a time (`--order blocks`) a
    chunk's base block and candidate block run minutes apart: a step of the machine inside a chunk
    biases that chunk's pairs though the run's means agree. Each side needs `min_samples`."""
    sides: dict[Any, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r["variant"] in (base, cand) and (r.get("samples") or 0) >= thresholds.min_samples:
            sides.setdefault(r["block"], {})[r["variant"]] = r
    bar, worst = _cpu_bar(thresholds, host_cores), None
    for blk, s in sides.items():
        if len(s) < 2:
            continue
        for key, limit, unit in (("foreign_cpu", bar, " cores"), ("steal", thresholds.steal, "")):
            b, c = s[base].get(key), s[cand].get(key)
            if b is not None and c is not None and abs(c - b) >= limit and (worst is None or abs(c - b) > worst[0]):
                worst = (abs(c - b), blk, key, b, c, unit)
    if worst is None:
        return None
    _, blk, key, b, c, unit = worst
    what = "foreign CPU" if key == "foreign_cpu" else "steal"
    return (f"machine load changed between the two sides of chunk {blk}: {what} {b:.2f} → {c:.2f}{unit} "
            f"({base} → {cand})")
