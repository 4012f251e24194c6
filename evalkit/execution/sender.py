"""Send one load level's work items to the live variants (their servers) and write one ledger row
per attempt. Sequential sends get exact per-request server phases (histogram deltas); concurrent
and open-loop sends get time-window attribution. A finished row waits only until the client's
lag probe and its server's scraper have passed its end (a fraction of a second), is then
settled (lag, window fields) and written in a batch with the others: nothing per request is
kept beyond what is in flight and what the stop rules ask for, so a million requests run in the
memory of a thousand. A level returns each variant's outcome for the stop rules, and the rows
themselves only when asked (the warm-ups' timing probes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby, islice
from typing import Any, Protocol

import aiohttp

from ..errors import EngineError
from ..ledger import Ledger, utcnow
from ..measure.client import RequestResult, build_payload, send_stamp, stream_chat
from ..measure.looplag import LagProbe
from ..measure.telemetry import SERVER_FIELDS, MetricsScraper, attribute, engine_config, response_timing
from ..measure.tokens import fill_token_counts
from ..measure.wire import WireClient, kernel_stamps_supported, stream_chat_wire
from ..spec.dataset import Case
from ..spec.matrix import Matrix
from .conversation import send_conversation
from .live import LiveVariant
from .load import Load, Work, WorkItem
from .patterns import Level
from .procs import LEAD_MS, SenderPool
from .rows import request_row
from .settle import Settler
from .signals import STOP, gather_or_cancel
from .stops import LevelOutcome, SloBreached


class Progress(Protocol):
    def request_done(self, variant: str, case: Case, result: RequestResult) -> None: ...


@dataclass
class LevelResult:
    outcomes: dict[str, LevelOutcome] = field(default_factory=dict)  # variant -> what the stop rules see
    rows: list[dict[str, Any]] = field(default_factory=list)  # the rows written, when kept


class Sender:
    """Executes work items against the live variants, writing one ledger row per attempt."""

    def __init__(self, ledger: Ledger, run_id: str, matrix: Matrix, servers: dict[str, LiveVariant],
                 progress: Progress, load: Load, seq_start: int = 0, epoch: float | None = None) -> None:
        self.ledger, self.run_id, self.matrix, self.servers = ledger, run_id, matrix, servers
        self.progress, self.load = progress, load
        self.seq = seq_start
        self.epoch = epoch if epoch is not None else time.perf_counter()  # the run's clock: every group on one
        self.scrapers: dict[str, MetricsScraper] = {}
        self.n = self.n_err = 0
        self.in_flight = self.max_in_flight = 0
        self.wire: WireClient | None = None
        self.pool: SenderPool | None = None  # the sending processes of this level (--client-procs), else None
        self.sending: set[asyncio.Future[RequestResult]] = set()
        self.dead: dict[str, str] = {}  # target -> why its server is gone
        self.probes: dict[int, LagProbe] = {}  # sending process (0: this one) -> its loop-lag windows
        self.opened: dict[Any, float] = {}  # in flight -> when it was sent (ms): older scrapes can go
        rule = load.rule(SloBreached)
        # what the stop rules need of each request: latencies for an absolute SLO, each case's for a relative one
        self.settler = Settler(ledger, matrix.telemetry, self.probes, self.scrapers, self.opened, self._now_ms,
                               keep_latencies=bool(rule and rule.slo.absolute_ms),  # type: ignore[attr-defined]
                               keep_cases=bool(load.slo.relative))

    def _now_ms(self) -> float:
        return (time.perf_counter() - self.epoch) * 1000.0

    def _payload(self, item: WorkItem, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
        gen = self.matrix.generation
        trace = item.case.attributes.get("task") == "trace"
        schema = item.case.schema_doc if gen.structured_output and not trace else None
        suite = item.case.attributes.get("suite_max_tokens")  # a suite item's own length, capped by the matrix
        max_tokens = item.case.max_tokens or (min(suite, gen.suite_max_tokens or suite) if suite else gen.max_tokens)
        extra = {**gen.extra_body, **({"ignore_eos": True} if item.case.max_tokens else {})}  # a trace's length holds
        prefix = [{"role": "system", "content": gen.shared_prefix}] if gen.shared_prefix and not trace else []
        return build_payload(
            self.servers[item.target].served, prefix + (messages or [m.model_dump() for m in item.case.messages]),
            max_tokens=min(max_tokens, gen.warmup_max_tokens) if item.warmup else max_tokens,
            temperature=gen.temperature, seed=gen.sampling_seed + item.repeat,
            top_p=gen.top_p, schema_name=item.case.schema_name, schema=schema, extra_body=extra,
        )

    async def send_item(self, http: aiohttp.ClientSession, item: WorkItem, attribute_now: bool,
                        scheduled_ms: float | None = None, messages: list[dict[str, str]] | None = None,
                        extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Send one item with the matrix's retry policy, whatever transport carries the bytes (this
        process, or a sending process of `--client-procs`); returns the rows it wrote. A
        conversation sends its turns in order, each with the variant's own earlier replies."""
        if item.case.turns and messages is None:
            return await send_conversation(self, http, item, attribute_now, scheduled_ms)
        lv = self.servers[item.target]
        scraper = self.scrapers.get(item.target)
        payload = self._payload(item, messages)
        retry = self.matrix.retry
        rows: list[dict[str, Any]] = []
        if STOP.requested and not item.warmup:
            return rows  # stopping: not sent, not a row; a resume sends it
        if item.target in self.dead:  # its server is gone: recorded, never silently dropped
            return [self.not_sent(item, self.dead[item.target], payload, extra)]
        for attempt in range(item.attempt0, item.attempt0 + retry.max_retries + 1):
            before = await scraper.scrape(http) if (attribute_now and scraper) else None
            token = object()
            self.opened[token] = self._now_ms()
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            send = asyncio.ensure_future(self._transport(http, lv, payload, scheduled_ms if attempt == item.attempt0
                                                         else None))
            self.sending.add(send)
            try:
                r, proc = await send
            except asyncio.CancelledError:
                if not (send.cancelled() and STOP.requested):
                    raise
                # the grace period after a stop ran out: this attempt is kept, not final; a resume sends it again
                r = RequestResult(started_at=utcnow(), error_class="interrupted",
                                  error=f"stopped by a signal {STOP.grace_s:g} s after it arrived, still in flight")
                self.seq += 1
                rows.append(self._write({**request_row(self.run_id, item, self.seq, attempt, False, payload, r,
                                                       scheduled_ms), **(extra or {})}))
                return rows
            finally:
                self.in_flight -= 1
                self.sending.discard(send)
                self.opened.pop(token, None)
            fill_token_counts(r, payload["messages"], lv.model_path)
            if r.error_class in ("connect_error", "stream_cut") and item.target not in self.dead:
                self._check_server(item.target)  # a server that just died: no more requests go to it
            last = attempt == item.attempt0 + retry.max_retries
            will_retry = (r.error_class in retry.on_errors) and not last and not STOP.requested
            self.seq += 1
            row = request_row(self.run_id, item, self.seq, attempt, not will_retry, payload, r,
                              scheduled_ms if attempt == item.attempt0 else None)
            if proc:
                row["client_proc"] = proc
            row.update(extra or {})
            if before is not None and scraper is not None and r.ok:  # a refused request is not in the histograms
                key = "e2e_request_latency_seconds_count"
                after = await scraper.wait_for_count(http, key, before.values.get(key, 0.0) + 1)
                if after is not None:
                    row.update(attribute(before.values, after.values, "histogram_delta",
                                         scraper.peak("kv_cache_usage_perc", before.mono_ms, after.mono_ms),
                                         scraper.scrapes_in(before.mono_ms, after.mono_ms),
                                         scraper.peaks(before.mono_ms, after.mono_ms)))
            row.update(response_timing({k: row.get(k) for k in SERVER_FIELDS if k in row}, r.server_timing))
            rows.append(self._write(row))
            if not will_retry:
                self._count(item, r)
                break
            await asyncio.sleep(r.retry_after_s if r.retry_after_s is not None else
                                retry.backoff_s * 2 ** (attempt - item.attempt0))
        return rows

    async def _transport(self, http: aiohttp.ClientSession, lv: LiveVariant, payload: dict[str, Any],
                         due_ms: float | None) -> tuple[RequestResult, int]:
        """The bytes of one attempt, sent when due: by a sending process (`--client-procs`), or here
        (kernel receive times where the platform has them; TLS or none: user-space stamps, recorded
        as such). Returns the result and the sending process (0: this one)."""
        url = f"{lv.base_url}/v1/chat/completions"
        timeout_s = self.matrix.generation.timeout_s
        if self.pool is not None:
            return await self.pool.send(url, payload, lv.headers, due_ms)
        if due_ms is not None and (delay := (due_ms - self._now_ms()) / 1000.0) > 0:
            await asyncio.sleep(delay)
        if self.wire is not None and url.startswith("http://"):
            return await stream_chat_wire(self.wire, url, payload, headers=lv.headers, timeout_s=timeout_s,
                                          epoch=self.epoch), 0
        return await stream_chat(http, url, payload, headers=lv.headers, timeout_s=timeout_s, epoch=self.epoch), 0

    def not_sent(self, item: WorkItem, why: str, payload: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The one row of a request that was never sent (its server died, an earlier turn of its
        conversation failed): final, counted, never silently dropped."""
        r = RequestResult(started_at=utcnow(), error_class="not_sent", error=why)
        self.seq += 1
        row = self._write({**request_row(self.run_id, item, self.seq, item.attempt0, True, payload or {}, r),
                           **(extra or {})})
        self._count(item, r)
        return row

    def _write(self, row: dict[str, Any]) -> dict[str, Any]:
        """One finished attempt: settled and written with the next batch (`Settler`)."""
        self.settler.add(row)
        return row

    def _count(self, item: WorkItem, r: RequestResult) -> None:
        if not item.warmup:
            self.n += 1
            self.n_err += 0 if r.ok else 1
        self.progress.request_done(item.variant, item.case, r)

    def _check_server(self, target: str) -> None:
        lv = self.servers[target]
        if lv.server is not None and lv.server.exited(grace_s=0.2):
            self.dead[target] = lv.server_died()

    async def _watch(self, stop: asyncio.Event) -> None:
        """The watchdog: a launched server that exits mid-run is noticed within half a second;
        nothing more is sent to it, and its variant records the exit code and log tail. A stop
        request ends the sending, and after the grace period cancels what is still in flight."""
        stop_seen: float | None = None
        while True:
            for target, lv in self.servers.items():
                if target not in self.dead and lv.server is not None and not lv.server.alive():
                    self.dead[target] = lv.server_died()
            if stop.is_set() and stop_seen is None:
                stop_seen = time.monotonic()
            if stop_seen is not None and time.monotonic() - stop_seen >= STOP.grace_s:
                for task in list(self.sending):
                    task.cancel()
            await asyncio.sleep(0.25 if stop_seen is None else 0.05)

    async def _start_scrapers(self, http: aiohttp.ClientSession) -> list[asyncio.Task[None]]:
        for name, lv in self.servers.items():
            if name not in self.scrapers and self.matrix.telemetry.scrape:
                sc = MetricsScraper(self.ledger, self.run_id, lv.variant.name, lv.base_url, self.epoch,
                                    self.matrix.telemetry.interval_s, lv.headers, replica=lv.replica)
                first = await sc.scrape(http)
                if not lv.replica:
                    self.ledger.update_variant(lv.vid, {"metrics_available": "yes" if first else "no"})
                    if first:
                        lv.record_engine_cache(engine_config(sc.last_samples))
                if first:
                    self.scrapers[name] = sc
        tasks = []
        for sc in self.scrapers.values():
            sc.restart()
            tasks.append(asyncio.create_task(sc.run(http)))
        return tasks

    async def run(self, items: Iterable[WorkItem], level: Level, keep_rows: bool = False) -> LevelResult:
        """Send one level's items (a list, or `Work` generating them). Sequential: server phases
        from per-request histogram deltas; otherwise by time window. Returns each variant's
        outcome (and the rows when ``keep_rows``)."""
        tel = self.matrix.telemetry
        self.settler.start_level(window_attribution=not level.sequential, keep_rows=keep_rows)
        self.wire = WireClient() if tel.kernel_timestamps and kernel_stamps_supported() else None
        self.probes.clear()
        self.probes[0] = LagProbe(self.epoch)
        probe_task = asyncio.create_task(self.probes[0].run())
        stop = STOP.event()
        watch = asyncio.create_task(self._watch(stop))
        sent = asyncio.Event()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trace_configs=[send_stamp()]) as http:
            tasks = await self._start_scrapers(http)
            try:
                await gather_or_cancel(self._send_all(http, items, level, sent), self.settler.run(sent))
            finally:
                for sc in self.scrapers.values():
                    sc.stop()
                await asyncio.gather(*tasks, return_exceptions=True)
                for sc in self.scrapers.values():
                    await sc.scrape(http)  # one last point after the load
                self.probes[0].stop()
                watch.cancel()
                await asyncio.gather(probe_task, watch, return_exceptions=True)
                STOP.forget(stop)
                if self.wire is not None:
                    self.wire.close()
                self.settler.settle(final=True)  # whatever ended the level, every finished request is written
                for proc, probe in self.probes.items():
                    self.ledger.insert_client_lag(probe.rows(self.run_id, level.name, proc))
        return LevelResult(self.settler.outcomes, self.settler.kept or [])

    async def _send_all(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], level: Level,
                        sent: asyncio.Event) -> None:
        n = self.load.policy.client_procs
        if n > 1 and not level.sequential:  # one request at a time gains nothing from other processes
            self.pool = SenderPool(n, self.epoch, self.matrix.generation.timeout_s,
                                   self.matrix.telemetry.kernel_timestamps, self._on_lag)
            for k in range(n):
                self.probes[k + 1] = LagProbe(self.epoch)
        try:
            if self.pool is not None:
                await self.pool.start()
            await self._send_targets(http, items, level)
            if self.pool is not None:
                errors = await self.pool.close()
                if errors:
                    raise EngineError("; ".join(errors))
        except BaseException:
            if self.pool is not None:
                await self.pool.abort()
            raise
        finally:
            self.pool = None
            sent.set()

    def _on_lag(self, proc: int, windows: list[tuple[float, float]]) -> None:
        probe = self.probes[proc]
        probe.times += [t for t, _ in windows]
        probe.lags += [lag for _, lag in windows]

    async def _send_targets(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], level: Level) -> None:
        order = self.load.policy.order
        if order.alternates and not level.sequential and len({s.variant.name for s in self.servers.values()}) > 1:
            # alternated under load (`order.py`): each chunk of cases is sent to one variant at a time, as a
            # block of the level's load; its open-loop arrivals go on where that variant's last block left off
            sent: dict[str, int] = {}
            for _, group in groupby(items, key=lambda it: (it.order_block, it.order_position)):
                part = list(group)
                v = part[0].variant
                await self._side_by_side(http, part, level, sent.get(v, 0))
                sent[v] = sent.get(v, 0) + len(part)
                if STOP.requested:
                    return
            return
        await self._side_by_side(http, items, level)

    async def _side_by_side(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], level: Level,
                            skip: int = 0) -> None:
        targets = items.target_names() if isinstance(items, Work) else list(dict.fromkeys(it.target for it in items))
        if any("#" in t for t in targets):
            # replicated variants: each server runs its shard under the load, side by side
            await gather_or_cancel(*(self._pipeline(http, _for_target(items, t), level, skip) for t in targets))
        else:
            await self._pipeline(http, items, level, skip)

    async def _pipeline(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], level: Level,
                        skip: int = 0) -> None:
        if level.sequential:
            for item in items:
                await self.send_item(http, item, attribute_now=True)
        elif level.open_loop:
            await self._open_loop(http, items, level, skip)
        else:
            await self._closed_loop(http, items, level.concurrency)

    async def _closed_loop(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], concurrency: int) -> None:
        """N workers, each sending its next request when the last one finished (the items are
        drawn one at a time from one iterator: none waits in a queue)."""
        source = iter(items)

        async def worker() -> None:
            for item in source:
                await self.send_item(http, item, attribute_now=False)
                if STOP.requested:
                    return

        await gather_or_cancel(*(worker() for _ in range(concurrency)))

    async def _open_loop(self, http: aiohttp.ClientSession, items: Iterable[WorkItem], level: Level,
                         skip: int = 0) -> None:
        """Arrivals on the level's schedule, whatever the server does. Each request is due at its
        scheduled time on the run's clock and becomes a task only then (a million arrivals are
        never a million waiting tasks) — a moment earlier (`LEAD_MS`) when sending processes carry
        it, so this loop's lag never delays a send; a cap (`max_in_flight`) may hold it back, and
        that wait is stored (`client_wait_ms`), as is any lateness of the event loop itself."""
        cap = asyncio.Semaphore(level.max_in_flight) if level.max_in_flight else None
        lead = LEAD_MS if self.pool is not None and cap is None else 0.0  # a capped request waits for room here
        start_ms = self._now_ms() + 5.0  # a common origin a moment ahead, so the first is not late
        live: set[asyncio.Task[Any]] = set()
        failed: list[BaseException] = []

        async def arrive(item: WorkItem, due_ms: float) -> None:
            if cap is None:
                await self.send_item(http, item, attribute_now=False, scheduled_ms=due_ms)
                return
            async with cap:
                await self.send_item(http, item, attribute_now=False, scheduled_ms=due_ms)

        def finished(t: asyncio.Task[Any]) -> None:
            live.discard(t)
            if not t.cancelled() and t.exception() is not None:
                failed.append(t.exception())  # type: ignore[arg-type]

        arrivals = islice(level.arrivals(), skip, None)  # a block of an alternated level: its stretch of the schedule
        first: float | None = None
        try:
            for item, off in zip(items, arrivals, strict=False):
                first = (off if skip else 0.0) if first is None else first  # a later stretch starts now
                due = start_ms + (off - first) * 1000.0
                delay = (due - lead - self._now_ms()) / 1000.0
                if delay > 0:
                    await asyncio.sleep(delay)
                if failed or STOP.requested:
                    break
                t = asyncio.create_task(arrive(item, due))
                live.add(t)
                t.add_done_callback(finished)
            if live:
                await asyncio.wait(set(live))
        except BaseException:
            for t in list(live):
                t.cancel()
            await asyncio.gather(*live, return_exceptions=True)
            raise
        if failed:
            raise failed[0]


def _for_target(items: Iterable[WorkItem], target: str) -> Iterable[WorkItem]:
    if isinstance(items, Work):
        return _Filtered(items, target)
    return [it for it in items if it.target == target]


@dataclass
class _Filtered:
    """One server's share of a level's work, still generated on demand."""

    work: Work
    target: str

    def __iter__(self) -> Iterator[WorkItem]:
        return self.work.for_target(self.target)
