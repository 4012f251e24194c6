"""Progress that reaches a log: when output is not a terminal, a plain line per variant every
~15 s or every 10 % of its requests (done/total, errors, median TTFT of the latest requests, ETA)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..measure.client import RequestResult
from ..stats import percentile

RECENT = 2000  # the TTFTs a progress line's median is over


class ProgressLog:
    def __init__(self, variant: str, total: int, interval_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.variant, self.total, self.interval_s, self.clock = variant, total, interval_s, clock
        self.start = self.last = clock()
        self.done = self.errors = 0
        self.ttfts: deque[float] = deque(maxlen=RECENT)  # the latest only: a long run's line stays cheap
        self.next_pct = 10

    def line(self) -> str:
        elapsed = self.clock() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        p50 = percentile(list(self.ttfts), 50)
        pct = 100 * self.done / self.total if self.total else 100.0
        over = f" (latest {RECENT:,})" if self.done > RECENT else ""
        return (f"progress {self.variant}: {self.done}/{self.total} ({pct:.0f} %), errors {self.errors}, "
                f"TTFT p50 {'-' if p50 is None else f'{p50:,.0f} ms'}{over}, elapsed {elapsed:.0f} s, "
                f"ETA {'-' if eta is None else f'{eta:.0f} s'}")

    def add(self, result: RequestResult) -> str | None:
        """Count one finished request; return a line when one is due."""
        self.done += 1
        self.errors += 0 if result.ok else 1
        if result.ttft_ms is not None and result.ok:
            self.ttfts.append(result.ttft_ms)
        now = self.clock()
        pct = 100 * self.done / self.total if self.total else 100
        if now - self.last >= self.interval_s or pct >= self.next_pct or self.done == self.total:
            self.last = now
            while self.next_pct <= pct:
                self.next_pct += 10
            return self.line()
        return None
