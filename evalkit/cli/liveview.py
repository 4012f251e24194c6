"""The live view of a run on a terminal (rich.live): one row per variant with its throughput,
TTFT and ITL p50/p99 over the last window, the server's KV-cache use and waiting requests (its
/metrics, polled once a second), errors, the level or probe being sent and its ETA. Output that is
not a terminal (CI, a pipe, a file) gets the plain progress lines instead (`RichProgress`)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..measure.client import RequestResult
from ..measure.telemetry import canonical, parse_prometheus
from ..spec.dataset import Case
from ..stats import percentile
from .console import RichProgress

WINDOW_S = 10.0  # the window the throughput and percentiles are over
READY = re.compile(r"^'([^']+)' ready in .* at (https?://\S+)$")  # a launched server says where it listens


@dataclass
class Lane:
    """One variant as the live view shows it."""

    probe: str = "-"
    total: int = 0
    done: int = 0
    errors: int = 0
    started: float = field(default_factory=time.monotonic)
    recent: deque[tuple[float, float | None, float | None, int]] = field(default_factory=lambda: deque(maxlen=5000))
    kv: float | None = None
    waiting: float | None = None

    def add(self, r: RequestResult, now: float) -> None:
        self.done += 1
        self.errors += 0 if r.ok else 1
        if r.ok:
            self.recent.append((now, r.ttft_ms, r.itl_mean_ms, r.completion_tokens or 0))

    def window(self, now: float) -> list[tuple[float, float | None, float | None, int]]:
        while self.recent and self.recent[0][0] < now - WINDOW_S:
            self.recent.popleft()
        return list(self.recent)

    def eta_s(self, now: float) -> float | None:
        if not self.done or self.done >= self.total:
            return None
        return (now - self.started) / self.done * (self.total - self.done)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def server_gauges(url: str, timeout_s: float = 0.5) -> tuple[float | None, float | None]:
    """(KV-cache use 0-1, requests waiting) from a server's /metrics; (None, None) when it has none."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as resp:  # noqa: S310 (http only)
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None, None
    kv: float | None = None
    waiting: float | None = None
    for s in parse_prometheus(text):
        name = canonical(s.name)
        if name == "kv_cache_usage_perc":
            kv = max(kv or 0.0, s.value)
        elif name == "num_requests_waiting":
            waiting = (waiting or 0.0) + s.value
    return kv, waiting


class LiveView(RichProgress):
    """A run's progress as a live table on the terminal (stdout); messages still print above it."""

    def __init__(self, endpoints: dict[str, str] | None = None, console: Console | None = None,
                 poll_s: float = 1.0) -> None:
        super().__init__(quiet=False)
        self.console = console or Console()
        self.endpoints = dict(endpoints or {})  # variant -> base URL whose /metrics is polled
        self.lanes: dict[str, Lane] = {}
        self.open: set[str] = set()
        self.live: Live | None = None
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        if (m := READY.match(text)) is not None:
            self.endpoints[m.group(1).split("#")[0]] = m.group(2)
        super().say(text)

    def level_start(self, variant: str, total: int) -> None:
        name, _, probe = variant.partition(" ")
        with self._lock:
            self.lanes[name] = replace_lane(self.lanes.get(name), probe or "main", total)
            self.open.add(name)
        if self.live is None:
            self.live = Live(self.table(), console=self.console, refresh_per_second=4, transient=True,
                             get_renderable=self.table)
            self.live.start()
            self._stop.clear()
            self._poller = threading.Thread(target=self._poll, daemon=True)
            self._poller.start()

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        if case.id.startswith("_warmup"):
            return
        with self._lock:
            lane = self.lanes.get(variant)
            if lane is not None:
                lane.add(result, time.monotonic())

    def level_end(self, variant: str) -> None:
        self.open.discard(variant.split(" ")[0])
        if not self.open and self.live is not None:
            self._stop.set()
            if self._poller is not None:
                self._poller.join(timeout=2)
            self.live.stop()
            self.live = None

    def _poll(self) -> None:
        while not self._stop.is_set():
            for name in list(self.open):
                url = self.endpoints.get(name)
                if url:
                    kv, waiting = server_gauges(url)
                    with self._lock:
                        if name in self.lanes:
                            self.lanes[name].kv, self.lanes[name].waiting = kv, waiting
            self._stop.wait(self.poll_s)

    def table(self) -> Table:
        now = time.monotonic()
        t = Table(title=f"evalkit run: live (last {WINDOW_S:.0f} s; ms)", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
        for h in ("variant", "probe", "done", "req/s", "tok/s", "TTFT p50/p99", "ITL p50/p99", "KV %", "waiting",
                  "errors", "ETA"):
            t.add_column(h, justify="left" if h in ("variant", "probe") else "right", no_wrap=True)
        with self._lock:
            for name, lane in self.lanes.items():
                win = lane.window(now)
                span = min(WINDOW_S, max(now - lane.started, 1e-3))
                ttft = [x[1] for x in win if x[1] is not None]
                itl = [x[2] for x in win if x[2] is not None]
                eta = lane.eta_s(now)
                t.add_row(name, lane.probe, f"{lane.done}/{lane.total}", f"{len(win) / span:.2f}",
                          f"{sum(x[3] for x in win) / span:,.0f}",
                          f"{_ms(percentile(ttft, 50))}/{_ms(percentile(ttft, 99))}",
                          f"{_ms(percentile(itl, 50))}/{_ms(percentile(itl, 99))}",
                          "-" if lane.kv is None else f"{100 * lane.kv:.0f}",
                          "-" if lane.waiting is None else f"{lane.waiting:.0f}", str(lane.errors),
                          "-" if eta is None else f"{eta:.0f} s")
        return t


def replace_lane(old: Lane | None, probe: str, total: int) -> Lane:
    """A lane for the next level: its counters start again, the server's gauges stay."""
    lane = Lane(probe, total)
    if old is not None:
        lane.kv, lane.waiting = old.kv, old.waiting
    return lane


def progress_for(quiet: bool, endpoints: dict[str, Any] | None = None) -> RichProgress:
    """The live view when stdout is a terminal, else the plain progress (lines, or nothing when quiet)."""
    if not quiet and Console().is_terminal:
        return LiveView({k: v for k, v in (endpoints or {}).items() if v})
    return RichProgress(quiet)
