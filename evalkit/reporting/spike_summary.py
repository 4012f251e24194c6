"""Spike lists that stay small at any size: a large run has 10^5 spikes, and every one of them is
in the ledger's `derived_spikes` table (`evalkit browse`). The JSON, Markdown and HTML reports list
the largest and count the rest per slice and cause."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..ledger.spike_store import SPIKE_COLUMNS, Spikes
from .rows import FixedKeys

SPIKES_TOP = 50  # what `report --json` lists (the text report and the HTML page show fewer)


class Spike(FixedKeys):
    """One spike as a read-only mapping with the keys of `KEYS`, its ``line`` written when read, as
    it goes into `Spikes`."""

    KEYS = SPIKE_COLUMNS
    __slots__ = SPIKE_COLUMNS[:-1]

    def __init__(self, request_id: int, variant: str, complexity: str, case_id: str, concurrency: int, metric: str,
                 value: float, slice_median: float, robust_z: float, cause: str, evidence: str) -> None:
        self.request_id, self.variant, self.complexity, self.case_id = request_id, variant, complexity, case_id
        self.concurrency, self.metric, self.value, self.slice_median = concurrency, metric, value, slice_median
        self.robust_z, self.cause, self.evidence = robust_z, cause, evidence

    @property
    def line(self) -> str:
        where = f"{self.variant} {self.complexity}" + ("" if self.concurrency == 1 else f" c={self.concurrency}")
        return (f"{where} {self.case_id}: {self.metric.removesuffix('_ms').upper()} {self.value:,.0f} ms "
                f"(slice median {self.slice_median:,.0f} ms, robust z {self.robust_z:.1f}): {self.cause}: {self.evidence}")

    def __getitem__(self, key: str) -> Any:
        if key not in self.KEYS:
            raise KeyError(key)
        return getattr(self, key)


def spike_set(spikes: Spikes | Iterable[Mapping[str, Any]] | None) -> Spikes:
    """The findings' spikes as a `Spikes` (a list given, as a test or an older caller has them)."""
    return spikes if isinstance(spikes, Spikes) else Spikes(spikes or ())


def bounded(f: dict[str, Any]) -> dict[str, Any]:
    """The findings as `report --json` writes them: the largest spikes, their total and the counts
    per slice and cause (the full list: `derived_spikes`)."""
    spikes = spike_set(f.get("spikes"))
    return {**f, "spikes": spikes.largest(SPIKES_TOP), "spikes_total": len(spikes), "spike_counts": spikes.counts()}


def count_lines(spikes: Spikes, limit: int = 12) -> list[str]:
    """Per slice, how many spikes of each cause: `w8a8 long c=4 TTFT: 12 queued, 3 preemption`."""
    by: dict[tuple[Any, ...], list[str]] = {}
    totals: Counter[tuple[Any, ...]] = Counter()
    for e in spikes.counts():
        key = (e["variant"], e["complexity"], e["concurrency"], e["metric"])
        by.setdefault(key, []).append(f"{e['n']:,} {e['cause']}")
        totals[key] += e["n"]
    keys = sorted(by, key=lambda k: (-totals[k], *map(str, k)))
    out = [f"{v} {cx}{'' if (lv or 1) == 1 else f' c={lv}'} {m.removesuffix('_ms').upper()}: {', '.join(by[(v, cx, lv, m)])}"
           for v, cx, lv, m in keys[:limit]]
    if len(keys) > limit:
        out.append(f"... and {len(keys) - limit} more slices ({sum(totals[k] for k in keys[limit:]):,} spikes)")
    return out
