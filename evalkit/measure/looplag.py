"""The client's self-check: how late its own event loop runs. A timer due every few milliseconds
fires late by exactly the time the loop spent on other work; that lateness is what a user-space
timestamp would have added to a request's TTFT. Kept per window (its worst value) in the
ledger's `client_lag` table, and per request (`client_lag_max_ms`)."""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left, bisect_right


class LagProbe:
    def __init__(self, epoch: float, interval_s: float = 0.005, window_s: float = 0.1) -> None:
        self.epoch, self.interval_s, self.window_s = epoch, interval_s, window_s
        self.times: list[float] = []  # ms on the run's clock, one per window
        self.lags: list[float] = []  # the worst lateness in that window, ms
        self._stop = asyncio.Event()

    async def run(self) -> None:
        win_start = time.perf_counter()
        worst = 0.0
        while not self._stop.is_set():
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter()
            worst = max(worst, (now - due) * 1000.0)
            if now - win_start >= self.window_s:
                self.times.append((now - self.epoch) * 1000.0)
                self.lags.append(worst)
                win_start, worst = now, 0.0

    @classmethod
    def from_windows(cls, epoch: float, windows: list[tuple[float, float]]) -> LagProbe:
        """A probe rebuilt from another process's windows (a sending process of --client-procs)."""
        p = cls(epoch)
        p.times = [t for t, _ in windows]
        p.lags = [lag for _, lag in windows]
        return p

    def stop(self) -> None:
        self._stop.set()

    def max_between(self, start_ms: float, end_ms: float) -> float | None:
        """The worst lag in the windows that overlap [start, end]. Window k runs from the previous
        window's end to its own time: it overlaps when it ends at or after start and began at or
        before end (never a window that began after the request ended)."""
        i = bisect_left(self.times, start_ms)
        j = bisect_right(self.times, end_ms)  # window j began at times[j - 1] <= end
        vals = self.lags[i:j + 1]
        return max(vals) if vals else None

    def rows(self, run_id: str, level: str, proc: int = 0) -> list[dict]:
        return [{"run_id": run_id, "proc": proc, "level": level, "mono_ms": round(t, 3), "lag_ms": round(lag, 3)}
                for t, lag in zip(self.times, self.lags, strict=True)]
