"""The machine's load while a run measures (issue 47): about once a second, how much CPU processes
that are neither evalkit nor the variants' servers used (`foreign_cpu`), steal and iowait, load
average, CPU clock, memory pressure and, with NVML, the GPU's clock, throttling and foreign
processes. Rows go to the ledger's `env_samples` (m023) in batches, on the run's perf_counter
clock, so the report can join them to each variant's requests by time (docs/measuring.md,
"Machine load").

Attribution: foreign = busy CPU from /proc/stat (of the CPUs evalkit and the servers may run on,
`cpus`, when that is fewer than it shows) minus the CPU time of the known processes'
trees: this process and its descendants (evalkit), and the servers (launched ones by PID, an
endpoint on this host by the PID listening on its port), each with its descendants. A server on
another host has nothing here to attribute; it is not subtracted.

Runs as a thread (`start`/`stop`, the default) or as an asyncio task (`run`/`stop`). The thread is
the robust one: the sender's event loop lags under thousands of streams, exactly when the machine
is loaded, and an asyncio sampler's ticks would then be late; scanning /proc for every process is
blocking file I/O (milliseconds) that would add lag to that loop; a thread's sleep depends on
neither. SQLite connections belong to their thread, so the thread writes through its own
connection to the ledger file (WAL: it never blocks readers, and waits for the runner's short
writes); a ledger with no file (in memory, a Ray worker's mirror) gets the rows at `stop()`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LedgerWriteError
from ..ledger import Ledger, open_ledger, utcnow
from .gpuload import GPU_FIELDS, GpuReader
from .procfs import CpuTimes, ProcFS, ProcStat, affinity, descendants, local_port, sum_cpus

CPU_FIELDS = ("foreign_cpu", "own_cpu", "server_cpu", "busy_cpu", "steal", "iowait")
HOST_FIELDS = ("load1", "cpu_mhz", "mem_pressure", "mem_available_mb")
PORT_RESCAN_S = 10.0  # how often an endpoint's listener is looked for again once it is gone or unknown


def cpu_measures(prev: CpuTimes | None, now: CpuTimes | None, prev_procs: Mapping[int, ProcStat],
                 now_procs: Mapping[int, ProcStat], prev_known: set[int], now_known: set[int],
                 now_servers: set[int]) -> dict[str, float | None]:
    """Cores used over one interval (CPU-seconds per second) by everything (`busy_cpu`), the known
    processes split into evalkit (`own_cpu`) and the servers (`server_cpu`), and the rest
    (`foreign_cpu` = busy - known, clamped at 0); `steal` and `iowait` as shares of all CPU time.

    Process time counts utime+stime+cutime+cstime, each process's growth since the last sample
    (a process born since counts from 0). A known process that ended since the last sample was
    reaped by its parent, whose cutime/cstime then grew by the ended process's whole life: its
    last-seen total is subtracted, which leaves what it used in this interval. Everything is in
    clock ticks; the interval's length is the ticks /proc/stat counted per CPU, so no wall clock
    enters the arithmetic."""
    out: dict[str, float | None] = dict.fromkeys(CPU_FIELDS)
    if prev is None or now is None:
        return out
    d_total = now.total - prev.total
    if d_total <= 0:
        return out
    per_cpu = d_total / now.n_cpus  # ticks of the interval on one CPU
    out["steal"] = round((now.steal - prev.steal) / d_total, 4)
    out["iowait"] = round((now.iowait - prev.iowait) / d_total, 4)
    busy = (now.busy - prev.busy) / per_cpu

    def grown(pids: set[int]) -> int:
        return sum(now_procs[p].ticks - (prev_procs[p].ticks if p in prev_procs else 0) for p in pids if p in now_procs)

    ended = sum(prev_procs[p].ticks for p in prev_known if p not in now_procs and p in prev_procs)
    known = max(0.0, (grown(now_known) - ended) / per_cpu)
    server = max(0.0, grown(now_servers) / per_cpu)
    out["busy_cpu"] = round(busy, 3)
    out["server_cpu"] = round(min(server, known), 3)
    out["own_cpu"] = round(max(0.0, known - server), 3)
    out["foreign_cpu"] = round(max(0.0, busy - known), 3)
    return out


@dataclass
class _Snap:
    t: float  # perf_counter()
    cpu: CpuTimes | None
    procs: dict[int, ProcStat]
    known: set[int]
    servers: set[int]
    per_cpu: dict[int, CpuTimes] = field(default_factory=dict)
    cpus: set[int] = field(default_factory=set)  # where evalkit and the servers may run (empty: unknown)


@dataclass
class EnvSampler:
    """Samples the machine every ``interval_s`` into ``env_samples``.

    ``known_pids()``: variant -> PIDs of its launched servers (each with its process tree);
    ``endpoints()``: variant -> base URLs; one on this host is attributed to the PID listening on
    its port. Both are called at every sample (from the sampler's thread: return a copy, or a
    mapping nobody mutates meanwhile), so servers that start later are picked up.
    ``epoch``: the perf_counter() origin of the run's request timings (`mono_start_ms`).
    ``set_active(variants)``: which variants have requests in flight; a row names every variant
    active at any moment of its interval."""

    ledger: Ledger
    run_id: str
    epoch: float
    known_pids: Callable[[], Mapping[str, Iterable[int]]] = dict
    endpoints: Callable[[], Mapping[str, Iterable[str]]] = dict
    interval_s: float = 1.0
    flush_every_s: float = 10.0  # rows are written in batches: a transaction every ~10 samples
    root: str | Path = "/"
    gpu: GpuReader | None = None  # None: NVML if present
    own_pid: int = field(default_factory=os.getpid)
    errors: int = 0  # samples or writes that failed; sampling goes on
    last_error: str | None = None
    written: int = 0
    _fs: ProcFS = field(init=False)
    _prev: _Snap | None = field(default=None, init=False)
    _pending: list[dict[str, Any]] = field(default_factory=list, init=False)
    _active: set[str] = field(default_factory=set, init=False)
    _seen: set[str] = field(default_factory=set, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _ports: dict[str, int | None] = field(default_factory=dict, init=False)  # URL -> local port (None: elsewhere)
    _listeners: dict[int, tuple[float, set[int]]] = field(default_factory=dict, init=False)  # port -> (when, pids)

    def __post_init__(self) -> None:
        self._fs = ProcFS(self.root)

    # --- what the caller tells it ---------------------------------------------------------------

    def set_active(self, variants: Iterable[str] | None) -> None:
        with self._lock:
            self._active = set(variants or ())
            self._seen |= self._active

    def _take_active(self) -> str | None:
        with self._lock:
            names, self._seen = self._seen | self._active, set(self._active)
        return ",".join(sorted(names)) or None

    # --- one sample -----------------------------------------------------------------------------

    def _server_roots(self, procs: Mapping[int, ProcStat]) -> set[int]:
        roots = {int(p) for pids in self.known_pids().values() for p in pids}
        now = time.monotonic()
        for urls in self.endpoints().values():
            for url in urls:
                if url not in self._ports:
                    self._ports[url] = local_port(url)
                port = self._ports[url]
                if port is None:
                    continue
                when, pids = self._listeners.get(port, (-1e18, set()))
                if not (pids & procs.keys()) and now - when >= PORT_RESCAN_S:
                    pids = self._fs.listeners(port)
                    self._listeners[port] = (now, pids)
                roots |= pids
        return roots

    def snapshot(self) -> _Snap:
        cpu, per_cpu = self._fs.cpu_times_both()
        t = time.perf_counter()  # the interval's edge is where /proc/stat was read
        procs = self._fs.processes()
        servers = descendants(procs, self._server_roots(procs))
        own = descendants(procs, [self.own_pid]) - servers  # a launched server is our child, but not ours
        cpus = affinity(own | servers) if Path(self.root) == Path("/") else set()
        return _Snap(t, cpu, procs, own | servers, servers, per_cpu, cpus)

    @staticmethod
    def _cpu_pair(prev: _Snap, now: _Snap) -> tuple[CpuTimes | None, CpuTimes | None]:
        """The CPU times to compare: only the CPUs evalkit and the servers may use, when that is
        fewer than the machine shows (pinned with taskset or a cpuset, or a container that sees the
        whole host's /proc/stat): load on other CPUs does not compete with them, and the bar for
        "different load" is sized by the CPUs measured."""
        cpus = now.cpus & prev.cpus
        if cpus and now.per_cpu and cpus < now.per_cpu.keys():
            return sum_cpus(prev.per_cpu, cpus), sum_cpus(now.per_cpu, cpus)
        return prev.cpu, now.cpu

    def sample(self) -> dict[str, Any] | None:
        """Read the machine now; the row for the interval since the last call (None the first time)."""
        now = self.snapshot()
        prev, self._prev = self._prev, now
        if self.gpu is None:
            self.gpu = GpuReader()
        if prev is None:
            self._take_active()
            return None
        prev_cpu, now_cpu = self._cpu_pair(prev, now)
        row: dict[str, Any] = {
            "run_id": self.run_id, "t_ms": round((now.t - self.epoch) * 1000.0, 3),
            "span_ms": round((now.t - prev.t) * 1000.0, 3), "ts": utcnow(), "variant_active": self._take_active(),
            "cpus": now_cpu.n_cpus if now_cpu is not None else None,
            **cpu_measures(prev_cpu, now_cpu, prev.procs, now.procs, prev.known, now.known, now.servers),
            "load1": self._fs.load1(), "cpu_mhz": self._fs.cpu_mhz(), "mem_pressure": self._fs.mem_pressure(),
            "mem_available_mb": self._fs.mem_available_mb(), **self.gpu.read(now.known),
        }
        return row

    def _sample_into_pending(self) -> None:
        try:
            row = self.sample()
        except Exception as e:  # noqa: BLE001 - one bad reading must not end the series
            self._failed(e)
            return
        if row is not None:
            with self._lock:
                self._pending.append(row)

    def _failed(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"[:300]

    def flush(self, ledger: Ledger | None = None) -> None:
        """Write the rows sampled so far in one transaction (through ``ledger``, default the
        sampler's own: call it from the thread that opened that ledger)."""
        with self._lock:
            rows, self._pending = self._pending, []
        if not rows:
            return
        try:
            (ledger or self.ledger).insert_env_samples(rows)
            self.written += len(rows)
        except LedgerWriteError as e:  # kept for the next flush: a locked ledger frees up
            self._failed(e)
            with self._lock:
                self._pending[:0] = rows

    # --- as a thread ----------------------------------------------------------------------------

    def start(self) -> None:
        """Sample in a background thread until `stop()`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._thread_main, name="evalkit-envload", daemon=True)
        self._thread.start()

    def _own_writer(self) -> Ledger | None:
        path = Path(str(self.ledger.path))
        if not path.is_file():
            return None  # in memory or mirrored: the owner's thread writes at stop()
        try:
            return open_ledger(path, create=False)
        except Exception as e:  # noqa: BLE001 - then the rows wait for stop()
            self._failed(e)
            return None

    def _thread_main(self) -> None:
        writer = self._own_writer()
        try:
            self._loop_blocking(writer)
        finally:
            self._close_gpu()
            if writer is not None:
                self.flush(writer)
                writer.close()

    def _loop_blocking(self, writer: Ledger | None) -> None:
        due = time.perf_counter()
        last_flush = due
        while not self._stop.is_set():
            self._sample_into_pending()
            if writer is not None and time.perf_counter() - last_flush >= self.flush_every_s:
                self.flush(writer)
                last_flush = time.perf_counter()
            due += self.interval_s
            self._stop.wait(max(0.0, due - time.perf_counter()))
            if time.perf_counter() - due > self.interval_s:  # fell behind (suspended): no burst to catch up
                due = time.perf_counter()

    def stop(self) -> None:
        """Stop sampling (thread or task) and write every row not yet written."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30.0)
            self._thread = None
        self.flush()  # what no thread could write (no file), or what a task left

    def _close_gpu(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None

    # --- as an asyncio task ---------------------------------------------------------------------

    async def run(self) -> None:
        """Sample in this event loop until `stop()`: each reading in a worker thread (the /proc scan
        blocks), each batch written here through the sampler's ledger."""
        self._stop.clear()
        due = time.perf_counter()
        last_flush = due
        try:
            while not self._stop.is_set():
                await asyncio.to_thread(self._sample_into_pending)
                if time.perf_counter() - last_flush >= self.flush_every_s:
                    self.flush()
                    last_flush = time.perf_counter()
                due += self.interval_s
                while not self._stop.is_set() and (left := due - time.perf_counter()) > 0:
                    await asyncio.sleep(min(left, 0.1))
                if time.perf_counter() - due > self.interval_s:
                    due = time.perf_counter()
        finally:
            self._close_gpu()
            self.flush()


__all__ = ["CPU_FIELDS", "GPU_FIELDS", "HOST_FIELDS", "EnvSampler", "cpu_measures"]
