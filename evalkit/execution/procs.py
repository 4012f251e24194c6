"""Every core: requests sent from several processes, each with its own event loop, while this
process keeps everything else — what to send (each conversation turn with the variant's own
replies), the schedule, the retry policy, the rows, the one ledger writer and the /metrics
scrapers. A sending process only sends bytes and stamps times: it takes a request (URL, payload,
headers and, for an open loop, when it is due on the run's clock), sends it when due, and posts
the result back. `time.perf_counter` is CLOCK_MONOTONIC on Linux, shared by every process of the
machine, so one schedule holds across processes.

`SenderPool` is the sender's transport when `--client-procs` is above one: `send()` resolves
when the request's result comes back, so every load pattern runs the same code in this process
whatever sends the bytes (execution/sender.py)."""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..measure.client import RequestResult
from ..measure.wire import kernel_stamps_supported

LEAD_MS = 1000.0  # an open-loop request reaches its process this long before it is due
LAG_EVERY_S = 0.25  # a child posts its closed loop-lag windows this often
DIED = "client_died"  # the error class of a request whose sending process died with it in hand


@dataclass
class Job:
    index: int
    url: str
    payload: dict[str, Any]
    headers: dict[str, str]
    due_ms: float | None = None  # open loop: when it is due, on the run's clock every process shares


@dataclass
class ChildPlan:
    proc: int
    epoch: float
    timeout_s: float
    kernel: bool


def default_procs(launched_locally: bool, cpus: int | None = None) -> int:
    """What the host can spare: one process when a server evalkit launched shares the machine (it
    needs the cores), else half the cores, at most 8."""
    cpus = cpus or os.cpu_count() or 1
    return 1 if launched_locally else max(1, min(8, cpus // 2))


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _frame(msg: Any) -> bytes:
    data = pickle.dumps(msg)
    return struct.pack("<I", len(data)) + data


def _put(msg: tuple[Any, ...]) -> None:
    """One message to the parent: a length-prefixed pickle on stdout."""
    try:
        sys.stdout.buffer.write(_frame(msg))
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the parent is gone (killed): nobody to tell, nothing to clean up
        os._exit(1)


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


async def _child_main(plan: ChildPlan) -> None:
    import aiohttp

    from ..measure.client import send_stamp, stream_chat
    from ..measure.looplag import LagProbe
    from ..measure.wire import WireClient, stream_chat_wire

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    threading.Thread(target=_read_inbox, args=(loop, inbox), daemon=True).start()
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
    _put(("ready", plan.proc))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trace_configs=[send_stamp()]) as http:
        async def one(job: Job) -> None:
            if job.due_ms is not None:
                delay = (job.due_ms - (time.perf_counter() - plan.epoch) * 1000.0) / 1000.0
                if delay > 0:
                    await asyncio.sleep(delay)
            if wire is not None and job.url.startswith("http://"):
                r = await stream_chat_wire(wire, job.url, job.payload, headers=job.headers,
                                           timeout_s=plan.timeout_s, epoch=plan.epoch)
            else:
                r = await stream_chat(http, job.url, job.payload, headers=job.headers, timeout_s=plan.timeout_s,
                                      epoch=plan.epoch)
            _put(("result", plan.proc, job.index, r))

        live: set[asyncio.Task[None]] = set()
        while (msg := await inbox.get())[0] == "job":
            t = asyncio.create_task(one(msg[1]))
            live.add(t)
            t.add_done_callback(live.discard)
        if live:
            await asyncio.gather(*live)
    if wire is not None:
        wire.close()
    probe.stop()
    lag_task.cancel()
    await asyncio.gather(probe_task, lag_task, return_exceptions=True)
    post_lag()


def child_main() -> None:
    """A sending process: its plan arrives pickled on stdin, then its requests; its results leave
    on stdout."""
    plan: ChildPlan = pickle.loads(sys.stdin.buffer.read(struct.unpack("<I", sys.stdin.buffer.read(4))[0]))
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


class SenderPool:
    """P sending processes of one level. `send` gives a request to the process with the fewest in
    hand and returns its result; a process that dies resolves what it held as `client_died`
    (a row each, never lost) and gets nothing more."""

    def __init__(self, n: int, epoch: float, timeout_s: float, kernel: bool,
                 on_lag: Callable[[int, list[tuple[float, float]]], None]) -> None:
        self.n, self.epoch, self.timeout_s = n, epoch, timeout_s
        self.kernel = kernel and kernel_stamps_supported()
        self.on_lag = on_lag
        self.procs: list[asyncio.subprocess.Process] = []
        self.holding: list[dict[int, asyncio.Future[RequestResult]]] = [{} for _ in range(n)]
        self.gone: set[int] = set()
        self.errors: list[str] = []
        self._done = 0
        self._next = 0
        self._pumps: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start every process (`python -m evalkit.execution.procs`: nothing of the caller's main
        module runs again) and wait until each is ready to send."""
        ready = [asyncio.get_running_loop().create_future() for _ in range(self.n)]
        for k in range(self.n):
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "evalkit.execution.procs",
                                                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            assert proc.stdin is not None
            proc.stdin.write(_frame(ChildPlan(k + 1, self.epoch, self.timeout_s, self.kernel)))
            await proc.stdin.drain()
            self.procs.append(proc)
            self._pumps.append(asyncio.create_task(self._pump(k, ready[k])))
        await asyncio.gather(*ready)

    async def _pump(self, k: int, ready: asyncio.Future[None]) -> None:
        stdout = self.procs[k].stdout
        assert stdout is not None
        try:
            while True:
                size = struct.unpack("<I", await stdout.readexactly(4))[0]
                msg = pickle.loads(await stdout.readexactly(size))
                kind = msg[0]
                if kind == "result":
                    fut = self.holding[k].pop(msg[2], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg[3])
                elif kind == "lag":
                    self.on_lag(msg[1], msg[2])
                elif kind == "ready" and not ready.done():
                    ready.set_result(None)
                elif kind == "error":
                    self.errors.append(f"sending process {msg[1]}: {msg[2]}")
                elif kind == "done":
                    self._done += 1
        except (asyncio.IncompleteReadError, ConnectionResetError):
            pass
        finally:
            self._lost(k, "the sending process ended")
            if not ready.done():
                ready.set_result(None)

    def _lost(self, k: int, why: str) -> None:
        self.gone.add(k)
        for fut in self.holding[k].values():
            if not fut.done():
                fut.set_result(RequestResult(started_at=_utcnow(), error_class=DIED,
                                             error=f"{why} with this request in hand (process {k + 1})"))
        self.holding[k].clear()

    async def send(self, url: str, payload: dict[str, Any], headers: dict[str, str],
                   due_ms: float | None) -> tuple[RequestResult, int]:
        """One request through the process holding the fewest; returns its result and the
        process's number (1-based, as `client_proc` stores it)."""
        alive = [k for k in range(self.n) if k not in self.gone]
        if not alive:
            return RequestResult(started_at=_utcnow(), error_class=DIED, error="every sending process has died"), 0
        k = min(alive, key=lambda i: len(self.holding[i]))
        self._next += 1
        fut: asyncio.Future[RequestResult] = asyncio.get_running_loop().create_future()
        self.holding[k][self._next] = fut
        stdin = self.procs[k].stdin
        assert stdin is not None
        try:
            stdin.write(_frame(("job", Job(self._next, url, payload, headers, due_ms))))
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._lost(k, "the sending process died")
        return await fut, k + 1

    async def close(self) -> list[str]:
        """No more requests: each process finishes what it holds, posts its last loop-lag windows
        and exits. Returns the processes' errors."""
        for k, proc in enumerate(self.procs):
            if k in self.gone or proc.stdin is None:
                continue
            try:
                proc.stdin.write(_frame(("end",)))
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._end_all()
        if self._done < len(self.procs):
            self.errors.append(f"{len(self.procs) - self._done} sending process(es) died without reporting")
        return self.errors

    async def abort(self) -> None:
        """Cancelled (a stop's grace ran out, a failure elsewhere): the processes go at once."""
        await self._end_all()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _end_all(self) -> None:
        """Kill whichever process is still there (after `close`, none should be) and reap them all."""
        for p in self.procs:
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            await p.wait()


def _utcnow() -> str:
    from ..ledger import utcnow

    return utcnow()


if __name__ == "__main__":
    child_main()
