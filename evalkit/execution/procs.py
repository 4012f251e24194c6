"""Every core: streams spread over several sending processes, each with its own event loop, while
this process keeps the one ledger writer, the /metrics scrapers and the schedule.

The parent builds each request (payload, headers, URL) and, for open-loop arrivals, its due time
on the run's clock; `time.perf_counter` is CLOCK_MONOTONIC on Linux, shared by every process of
the machine, so one schedule holds across processes. A closed loop of N streams gives each of P
processes its share of the streams over its share of the items. Children send (kernel-stamped
where the platform allows), retry per the matrix, and post each attempt's result back; the
parent turns results into ledger rows as they arrive, so nothing measured waits for the end."""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..measure.client import RequestResult
from .signals import STOP, gather_or_cancel

LEAD_MS = 1000.0  # an open-loop item reaches its process this long before it is due
LAG_EVERY_S = 0.25  # a child posts its closed loop-lag windows this often


@dataclass
class Job:
    index: int
    url: str
    payload: dict[str, Any]
    headers: dict[str, str]
    due_ms: float | None = None  # open loop: when it is due, on the run's clock every process shares


@dataclass
class ChildWork:
    proc: int
    jobs: list[Job]  # unused: jobs arrive on stdin as the child can take them
    streams: int  # closed loop: this process's share of the streams (0 for open loop)
    epoch: float
    timeout_s: float
    kernel: bool
    max_retries: int = 0
    on_errors: list[str] = field(default_factory=list)
    backoff_s: float = 1.0
    max_in_flight: int | None = None  # open loop: this process's share of a --max-concurrency cap


def default_procs(launched_locally: bool, cpus: int | None = None) -> int:
    """What the host can spare: one process when a server evalkit launched shares the machine (it
    needs the cores), else half the cores, at most 8."""
    cpus = cpus or os.cpu_count() or 1
    return 1 if launched_locally else max(1, min(8, cpus // 2))


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _put(msg: tuple[Any, ...]) -> None:
    """One message to the parent: a length-prefixed pickle on stdout."""
    data = pickle.dumps(msg)
    try:
        sys.stdout.buffer.write(struct.pack("<I", len(data)) + data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the parent is gone (killed): nobody to tell, nothing to clean up
        os._exit(1)


def _frame(msg: Any) -> bytes:
    data = pickle.dumps(msg)
    return struct.pack("<I", len(data)) + data


def _read_inbox(loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[tuple[Any, ...]]) -> None:
    """A thread: the parent's messages from stdin into the child's loop; the end of stdin ends the work."""
    try:
        while True:
            head = sys.stdin.buffer.read(4)
            if len(head) < 4:
                break
            msg = pickle.loads(sys.stdin.buffer.read(struct.unpack("<I", head)[0]))
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
    finally:
        loop.call_soon_threadsafe(inbox.put_nowait, ("end",))


async def _child_main(plan: ChildWork) -> None:
    import aiohttp

    from ..measure.client import send_stamp, stream_chat
    from ..measure.looplag import LagProbe
    from ..measure.wire import WireClient, stream_chat_wire

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    threading.Thread(target=_read_inbox, args=(loop, inbox), daemon=True).start()
    _put(("ready", plan.proc))
    first = await inbox.get()  # ("start", ms): every process starts on one moment
    if first[0] != "start":
        return
    probe = LagProbe(plan.epoch)
    probe_task = asyncio.create_task(probe.run())
    posted = [0]

    def post_lag() -> None:
        new = list(zip(probe.times[posted[0]:], probe.lags[posted[0]:], strict=True))
        posted[0] += len(new)
        if new:
            _put(("lag", plan.proc, new))

    async def lag_poster() -> None:
        while True:
            await asyncio.sleep(LAG_EVERY_S)
            post_lag()

    lag_task = asyncio.create_task(lag_poster())
    wire = WireClient() if plan.kernel else None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trace_configs=[send_stamp()]) as http:
        async def one(job: Job) -> None:
            for attempt in range(plan.max_retries + 1):
                if wire is not None and job.url.startswith("http://"):
                    r = await stream_chat_wire(wire, job.url, job.payload, headers=job.headers,
                                               timeout_s=plan.timeout_s, epoch=plan.epoch)
                else:
                    r = await stream_chat(http, job.url, job.payload, headers=job.headers, timeout_s=plan.timeout_s,
                                          epoch=plan.epoch)
                retry = r.error_class in plan.on_errors and attempt < plan.max_retries
                _put(("result", plan.proc, job.index, attempt, retry, r))
                if not retry:
                    return
                await asyncio.sleep(r.retry_after_s if r.retry_after_s is not None else plan.backoff_s * 2 ** attempt)

        if plan.streams:
            jobs: asyncio.Queue[Job | None] = asyncio.Queue()

            async def pump() -> None:
                while (msg := await inbox.get())[0] == "jobs":
                    for j in msg[1]:
                        jobs.put_nowait(j)
                jobs.put_nowait(None)

            async def worker() -> None:
                while (job := await jobs.get()) is not None:
                    await one(job)
                jobs.put_nowait(None)  # the end, for the next worker too

            await gather_or_cancel(pump(), *(worker() for _ in range(plan.streams)))
        else:
            cap = asyncio.Semaphore(plan.max_in_flight) if plan.max_in_flight else None
            live: set[asyncio.Task[None]] = set()

            async def arrive(job: Job) -> None:
                delay = ((job.due_ms or 0.0) - (time.perf_counter() - plan.epoch) * 1000.0) / 1000.0
                if delay > 0:
                    await asyncio.sleep(delay)
                if cap is None:
                    await one(job)
                    return
                async with cap:
                    await one(job)

            while (msg := await inbox.get())[0] == "jobs":
                for j in msg[1]:
                    t = asyncio.create_task(arrive(j))
                    live.add(t)
                    t.add_done_callback(live.discard)
            if live:
                await gather_or_cancel(*live)
    if wire is not None:
        wire.close()
    probe.stop()
    lag_task.cancel()
    await asyncio.gather(probe_task, lag_task, return_exceptions=True)
    post_lag()


def child_main() -> None:
    """A sending process: its plan arrives pickled on stdin, then its start and its items; its
    results leave on stdout."""
    plan: ChildWork = pickle.loads(sys.stdin.buffer.read(struct.unpack("<I", sys.stdin.buffer.read(4))[0]))
    try:
        asyncio.run(_child_main(plan))
    except BaseException as e:  # reported, so the parent can record what was lost and why
        _put(("error", plan.proc, f"{type(e).__name__}: {e}"))
    finally:
        _put(("done", plan.proc))
    # Everything is said (`_put` flushes). Skip the interpreter's shutdown: the stdin reader
    # thread may hold stdin's lock in a blocking read, which aborts finalization ("could not
    # acquire lock ... at interpreter shutdown") and would read as a crashed sender.
    os._exit(0)


class Children:
    """The sending processes of one level as the parent feeds them: what each holds and has not
    finished (a closed loop gives more only when results come back)."""

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs
        self.holding = [0] * len(procs)
        self.gone: set[int] = set()
        self.room = asyncio.Event()
        self.closed = False

    async def send(self, k: int, msg: tuple[Any, ...]) -> bool:
        if k in self.gone:
            return False
        stdin = self.procs[k].stdin
        assert stdin is not None
        try:
            stdin.write(_frame(msg))
            await stdin.drain()
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.gone.add(k)  # the process died: its results say what it had
            return False

    def finished(self, proc: int) -> None:
        """A child's item got its final result: room for another."""
        self.holding[proc - 1] -= 1
        self.room.set()

    async def feed_pull(self, jobs: Iterator[Job], streams: list[int]) -> None:
        """Closed loop: each process holds its streams plus a few more; it gets more as it finishes."""
        limit = [s + max(8, s // 2) for s in streams]
        while not STOP.requested:
            self.room.clear()
            for k in range(len(self.procs)):
                want = limit[k] - self.holding[k]
                if want <= 0 or k in self.gone:
                    continue
                batch = list(islice(jobs, want))
                if batch and await self.send(k, ("jobs", batch)):
                    self.holding[k] += len(batch)
                if len(batch) < want:
                    return  # every item is out
            if len(self.gone) == len(self.procs):
                return
            await self.room.wait()

    async def feed_schedule(self, jobs: Iterator[Job], now_ms: Callable[[], float]) -> None:
        """Open loop: item i goes to process i mod N a moment (LEAD_MS) before it is due."""
        for i, job in enumerate(jobs):
            wait = (job.due_ms or 0.0) - LEAD_MS - now_ms()
            if wait > 0:
                await asyncio.sleep(wait / 1000.0)
            if STOP.requested:
                return
            k = i % len(self.procs)
            if await self.send(k, ("jobs", [job])):
                self.holding[k] += 1

    async def close(self) -> None:
        """No more items: each process finishes what it holds and reports."""
        if not self.closed:
            self.closed = True
            for k in range(len(self.procs)):
                await self.send(k, ("end",))


@dataclass
class Posted:
    proc: int
    index: int
    attempt: int
    retry: bool
    result: RequestResult


async def run_children(plans: list[ChildWork], on_result: Callable[[Posted], Awaitable[None]], epoch: float,
                       feed: Callable[[Children, float], Awaitable[None]],
                       on_lag: Callable[[int, list[tuple[float, float]]], None]) -> list[str]:
    """Start one process per plan (`python -m evalkit.execution.procs`: nothing of the caller's
    main module runs again), start them together once all are ready, feed them with ``feed``
    (given the common start, ms on the run's clock), and hand each posted result to ``on_result``
    and each batch of loop-lag windows to ``on_lag`` (in this loop) as they arrive. Returns the
    children's errors."""
    procs = []
    for p in plans:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "evalkit.execution.procs",
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(_frame(p))
        await proc.stdin.drain()
        procs.append(proc)
    children = Children(procs)
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    async def pump(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while True:
                n = struct.unpack("<I", await proc.stdout.readexactly(4))[0]
                await queue.put(pickle.loads(await proc.stdout.readexactly(n)))
        except asyncio.IncompleteReadError:
            await queue.put(("gone",))

    async def feeding(start_ms: float) -> None:
        try:
            await feed(children, start_ms)
        finally:
            await children.close()

    pumps = [asyncio.create_task(pump(p)) for p in procs]
    errors: list[str] = []
    running, ready, done = len(procs), 0, 0
    feeder: asyncio.Task[None] | None = None
    try:
        while running:
            msg = await queue.get()
            kind = msg[0]
            if kind == "ready":
                ready += 1
                if ready == len(procs):
                    start_ms = (time.perf_counter() - epoch) * 1000.0 + 20.0  # a moment ahead: nobody starts late
                    for k in range(len(procs)):
                        await children.send(k, ("start", start_ms))
                    feeder = asyncio.create_task(feeding(start_ms))
            elif kind == "result":
                posted = Posted(*msg[1:])
                if not posted.retry:
                    children.finished(posted.proc)
                await on_result(posted)
            elif kind == "lag":
                on_lag(msg[1], msg[2])
            elif kind == "error":
                errors.append(f"sending process {msg[1]}: {msg[2]}")
            elif kind == "done":
                done += 1
            elif kind == "gone":
                running -= 1
    finally:
        if feeder is not None and not feeder.done():
            feeder.cancel()
        if feeder is not None:
            got = await asyncio.gather(feeder, return_exceptions=True)
            if isinstance(got[0], Exception):
                errors.append(f"feeding the sending processes: {type(got[0]).__name__}: {got[0]}")
        for p in procs:
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
            await p.wait()
        for t in pumps:
            t.cancel()
    if done < len(procs):
        errors.append(f"{len(procs) - done} sending process(es) died without reporting")
    return errors


if __name__ == "__main__":
    child_main()
