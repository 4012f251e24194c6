"""Settling: a finished request's row waits here until the client's lag probe and its server's
scraper have passed its end (a fraction of a second); it then gets the client's own lag over the
request (which marks a row whose timing the client may have bent) and, under concurrent load,
server fields by time window, and is written with the others in one transaction. The stop rules'
outcomes are fed the same rows; the scrapes no open request needs are dropped. Nothing per
request outlives its settling, so memory follows what is in flight, not the run's length."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..ledger import Ledger
from ..measure.looplag import LagProbe
from ..measure.telemetry import RESPONSE_FIELDS, MetricsScraper, attribute, response_timing
from ..spec.matrix import Telemetry
from .rows import timing_suspect
from .stops import LevelOutcome

SETTLE_S = 0.2  # how often finished rows are settled and written


class Settler:
    def __init__(self, ledger: Ledger, telemetry: Telemetry, probes: dict[int, LagProbe],
                 scrapers: dict[str, MetricsScraper], opened: dict[Any, float], now_ms: Callable[[], float],
                 keep_latencies: bool = True, keep_cases: bool = True) -> None:
        self.ledger, self.telemetry, self.now_ms = ledger, telemetry, now_ms
        self.probes, self.scrapers, self.opened = probes, scrapers, opened  # the sender's, shared
        self.keep_latencies, self.keep_cases = keep_latencies, keep_cases
        self.unsettled: list[dict[str, Any]] = []
        self.outcomes: dict[str, LevelOutcome] = {}
        self.kept: list[dict[str, Any]] | None = None
        self.window_attribution = False
        self.written = 0  # rows written, all levels

    def start_level(self, window_attribution: bool, keep_rows: bool) -> None:
        self.unsettled, self.outcomes, self.kept = [], {}, ([] if keep_rows else None)
        self.window_attribution = window_attribution

    def add(self, row: dict[str, Any]) -> None:
        self.unsettled.append(row)

    def ready(self, row: dict[str, Any], now_ms: float) -> bool:
        """Whether everything a row's settling reads has passed its end: the lag probe of the
        process that sent it and, for window attribution, its server's scraper. A probe or
        scraper that stopped advancing (a server without /metrics any more) holds a row at most
        `horizon` ms."""
        if row["mono_start_ms"] is None:
            return True
        end = row["mono_start_ms"] + (row["e2e_ms"] or 0.0)
        if now_ms - end > self.horizon_ms:
            return True
        probe = self.probes.get(row.get("client_proc") or 0)
        if probe is not None and (not probe.times or probe.times[-1] < end):
            return False
        if self.window_attribution:
            sc = self.scrapers.get(_target(row))
            if sc is not None and sc.available and (sc.last_ms is None or sc.last_ms < end):
                return False
        return True

    def settle(self, final: bool = False) -> None:
        """Settle the rows whose windows have closed (all of them when ``final``): the client's
        own lag over each request, which marks a row whose timing the client may have bent, and
        server fields by time window (concurrent sends); write them in one transaction, hand
        them to the stop rules' outcomes, and forget the scrapes no open request needs."""
        if not self.unsettled:
            self.forget()
            return
        now = self.now_ms()
        ready: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        for row in self.unsettled:
            (ready if final or self.ready(row, now) else waiting).append(row)
        if not ready:
            return
        thr = self.telemetry.client_lag_threshold_ms
        for row in ready:
            if row["mono_start_ms"] is None:
                continue
            start, end = row["mono_start_ms"], row["mono_start_ms"] + (row["e2e_ms"] or 0.0)
            probe = self.probes.get(row.get("client_proc") or 0)
            lag = probe.max_between(start, end) if probe else None
            fields: dict[str, Any] = {"client_lag_max_ms": lag, "timing_suspect": int(timing_suspect(row, lag, thr))}
            sc = self.scrapers.get(_target(row))
            if self.window_attribution and sc is not None:
                fields.update(attribute(sc.at(start), sc.first_after(end), "window",
                                        sc.peak("kv_cache_usage_perc", start, end), sc.scrapes_in(start, end),
                                        sc.peaks(start, end)))
                if row.get("srv_method") == "response":  # the request's own timing wins; the window's stays beside it
                    fields = {**fields, **response_timing(fields, {k: row.get(c) for c, k in RESPONSE_FIELDS.items()})}
            row.update(fields)
        self.ledger.insert_requests(ready)
        self.unsettled = waiting
        self.written += len(ready)
        for r in ready:
            if not r["is_warmup"] and r["final"]:
                o = self.outcomes.get(r["variant"])
                if o is None:
                    o = self.outcomes[r["variant"]] = LevelOutcome(keep_latencies=self.keep_latencies,
                                                                   keep_cases=self.keep_cases)
                o.add(r)
        if self.kept is not None:
            self.kept += ready
        self.forget()

    def forget(self) -> None:
        """Scrapes older than every open request and unsettled row are not needed any more."""
        starts = [r["mono_start_ms"] for r in self.unsettled if r["mono_start_ms"] is not None]
        oldest = min([*starts, *self.opened.values(), self.now_ms()])
        for sc in self.scrapers.values():
            sc.forget_before(oldest)

    @property
    def horizon_ms(self) -> float:
        return max(5000.0, 4000.0 * self.telemetry.interval_s)

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), timeout=SETTLE_S)
            except asyncio.TimeoutError:
                pass
            self.settle()


def _target(row: dict[str, Any]) -> str:
    return row["variant"] if row["replica"] is None else f"{row['variant']}#{row['replica']}"
