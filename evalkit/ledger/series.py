"""The ledger's server time series and the client's lag windows: /metrics samples as stored
(values when they change, per server), counters over a stretch of a server's clock, and the lag
probe's windows. Part of `Ledger` (the one owner of SQL)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .writes import _write


class SeriesReads:
    _db: Any

    # --- server samples -------------------------------------------------------------------------

    @_write
    def insert_server_samples(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._db["server_samples"].insert_all(rows)

    def server_series(self, run_id: str, series: str, variant: str | None = None) -> list[dict[str, Any]]:
        """(variant, replica, mono_ms, value) points of one /metrics series, in time order per server
        (values are stored when they change, so a point holds until the next one)."""
        sql = "select variant, replica, mono_ms, value from server_samples where run_id = ? and series = ?"
        params: list[Any] = [run_id, series]
        if variant is not None:
            sql += " and variant = ?"
            params.append(variant)
        return list(self._db.query(sql + " order by variant, replica, mono_ms", params))

    def series_delta(self, run_id: str, variant: str, series: str, start_ms: float | None = None,
                     end_ms: float | None = None, replica: int | None = None, every_replica: bool = True
                     ) -> float | None:
        """How much a server counter grew between two moments on its server's clock (the whole run
        when not given), summed over the variant's servers (each replica's counter is its own
        series: interleaved they would count each other's values as growth). ``replica`` with
        ``every_replica=False``: one server only."""
        by: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for p in self.server_series(run_id, series, variant):
            if every_replica or p["replica"] == replica:
                by[p["replica"]].append(p)
        if not by:
            return None

        def at(pts: list[dict[str, Any]], t: float | None, default: float) -> float:
            if t is None:
                return default
            before = [p["value"] for p in pts if p["mono_ms"] <= t]
            return before[-1] if before else pts[0]["value"]

        return sum(at(pts, end_ms, pts[-1]["value"]) - at(pts, start_ms, pts[0]["value"]) for pts in by.values())

    def level_counter_delta(self, run_id: str, variant: str, spans: dict[Any, tuple[float, float]], series: str,
                            until_ms: dict[Any, float] | None = None, margin_ms: float = 1000.0) -> float | None:
        """A server counter's growth over one load level, per server, summed: ``spans`` holds each
        server's (replica's) first send and last end at that level; the count runs to ``margin_ms``
        after the end (the scraper samples just after), but never past ``until_ms[replica]``, when
        the next level began on that server."""
        total, seen = 0.0, False
        for rep, (start, end) in spans.items():
            stop = end + margin_ms
            if until_ms and rep in until_ms:
                stop = min(stop, until_ms[rep] - 1e-3)
            d = self.series_delta(run_id, variant, series, start - 1, stop, rep, every_replica=False)
            if d is not None:
                total, seen = total + d, True
        return total if seen else None

    @_write
    def insert_client_lag(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._db["client_lag"].insert_all(rows)

    def client_lag(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._db.query("select proc, level, mono_ms, lag_ms from client_lag where run_id = ? "
                                   "order by mono_ms", [run_id]))

