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
import pickle
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..measure.client import RequestResult
from .signals import gather_or_cancel


@dataclass
class Job:
    index: int
    url: str
    payload: dict[str, Any]
    headers: dict[str, str]
    offset_ms: float | None = None  # open loop: when it is due, from the common start every process shares


@dataclass
class ChildWork:
    proc: int
    jobs: list[Job]
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
    import os

    cpus = cpus or os.cpu_count() or 1
    return 1 if launched_locally else max(1, min(8, cpus // 2))


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _put(msg: tuple[Any, ...]) -> None:
    """One message to the parent: a length-prefixed pickle on stdout."""
    data = pickle.dumps(msg)
    sys.stdout.buffer.write(struct.pack("<I", len(data)) + data)
    sys.stdout.buffer.flush()


async def _child_main(plan: ChildWork) -> None:
    import aiohttp

    from ..measure.client import send_stamp, stream_chat
    from ..measure.looplag import LagProbe
    from ..measure.wire import WireClient, stream_chat_wire

    _put(("ready", plan.proc))
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.buffer.readline)  # every process starts on one moment
    start_ms = float(line)
    probe = LagProbe(plan.epoch)
    probe_task = asyncio.create_task(probe.run())
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
            pending = list(plan.jobs)

            async def worker() -> None:
                while pending:
                    await one(pending.pop(0))

            await gather_or_cancel(*(worker() for _ in range(min(plan.streams, len(pending)) or 1)))
        else:
            cap = asyncio.Semaphore(plan.max_in_flight) if plan.max_in_flight else None

            async def arrive(job: Job) -> None:
                due = start_ms + (job.offset_ms or 0.0)
                delay = (due - (time.perf_counter() - plan.epoch) * 1000.0) / 1000.0
                if delay > 0:
                    await asyncio.sleep(delay)
                if cap is None:
                    await one(job)
                    return
                async with cap:
                    await one(job)

            await gather_or_cancel(*(arrive(j) for j in plan.jobs))
    if wire is not None:
        wire.close()
    probe.stop()
    await asyncio.gather(probe_task, return_exceptions=True)
    _put(("lag", plan.proc, list(zip(probe.times, probe.lags, strict=True))))


def child_main() -> None:
    """A sending process: its plan arrives pickled on stdin, its results leave on stdout."""
    plan: ChildWork = pickle.loads(sys.stdin.buffer.read(struct.unpack("<I", sys.stdin.buffer.read(4))[0]))
    try:
        asyncio.run(_child_main(plan))
    except BaseException as e:  # reported, so the parent can record what was lost and why
        _put(("error", plan.proc, f"{type(e).__name__}: {e}"))
    finally:
        _put(("done", plan.proc))


@dataclass
class Posted:
    proc: int
    index: int
    attempt: int
    retry: bool
    result: RequestResult


async def run_children(plans: list[ChildWork], on_result: Any, epoch: float, on_start: Any = None) -> tuple[
        float, dict[int, list[tuple[float, float]]], list[str]]:
    """Start one process per plan (`python -m evalkit.execution.procs`: nothing of the caller's
    main module runs again), start them together once all are ready, and hand each posted result
    to ``on_result`` (in this loop) as it arrives. Returns the common start (ms on the run's
    clock), each process's loop-lag windows and any child errors."""
    procs = []
    for p in plans:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "evalkit.execution.procs",
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        data = pickle.dumps(p)
        assert proc.stdin is not None
        proc.stdin.write(struct.pack("<I", len(data)) + data)
        await proc.stdin.drain()
        procs.append(proc)
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    async def pump(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while True:
                n = struct.unpack("<I", await proc.stdout.readexactly(4))[0]
                await queue.put(pickle.loads(await proc.stdout.readexactly(n)))
        except asyncio.IncompleteReadError:
            await queue.put(("gone",))

    pumps = [asyncio.create_task(pump(p)) for p in procs]
    lags: dict[int, list[tuple[float, float]]] = {}
    errors: list[str] = []
    running, ready, done = len(procs), 0, 0
    start_ms = 0.0
    try:
        while running:
            msg = await queue.get()
            kind = msg[0]
            if kind == "ready":
                ready += 1
                if ready == len(procs):
                    start_ms = (time.perf_counter() - epoch) * 1000.0 + 20.0  # a moment ahead: nobody starts late
                    if on_start is not None:
                        on_start(start_ms)
                    for p in procs:
                        assert p.stdin is not None
                        p.stdin.write(f"{start_ms!r}\n".encode())
                        await p.stdin.drain()
            elif kind == "result":
                await on_result(Posted(*msg[1:]))
            elif kind == "lag":
                lags[msg[1]] = msg[2]
            elif kind == "error":
                errors.append(f"sending process {msg[1]}: {msg[2]}")
            elif kind == "done":
                done += 1
            elif kind == "gone":
                running -= 1
    finally:
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
    return start_ms, lags, errors


if __name__ == "__main__":
    child_main()
