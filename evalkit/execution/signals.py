"""Stopping on request: SIGTERM, SIGINT and SIGHUP stop a run the same way. The first signal
stops sending new requests, gives those in flight a bounded grace period (then records each
as an `interrupted` attempt, which a resume sends again), stops the launched servers, marks the
run `interrupted` and says how to resume. A second SIGINT stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import EvalkitError

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class Interrupted(EvalkitError):
    """The run stopped because a signal asked it to; exit code 128 + the signal's number."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


class StopRequest:
    """Set by a signal handler; polled by the runner, watched by each sending loop."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.grace_s = 10.0
        self._events: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int) -> None:
        self.signum = self.signum or signum
        with self._lock:
            for loop, ev in list(self._events):
                if not loop.is_closed():
                    loop.call_soon_threadsafe(ev.set)

    def event(self) -> asyncio.Event:
        """An event the running loop's tasks can await; set when a stop is requested."""
        ev = asyncio.Event()
        if self.signum is not None:
            ev.set()
        with self._lock:
            self._events.append((asyncio.get_running_loop(), ev))
        return ev

    def forget(self, ev: asyncio.Event) -> None:
        with self._lock:
            self._events = [(lp, e) for lp, e in self._events if e is not ev]

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    def reset(self) -> None:
        self.signum = None


STOP = StopRequest()


@contextlib.contextmanager
def graceful_stop(grace_s: float = 10.0) -> Iterator[StopRequest]:
    """Within this block SIGTERM, SIGHUP and a first SIGINT request a graceful stop (STOP);
    a second SIGINT raises KeyboardInterrupt at once. Handlers are restored on the way out."""
    STOP.reset()
    STOP.grace_s = grace_s
    old = {}

    def handler(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and STOP.requested:
            raise KeyboardInterrupt
        STOP.request(signum)

    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        old[s] = signal.signal(s, handler)
    try:
        yield STOP
    finally:
        for s, h in old.items():
            signal.signal(s, h)


async def gather_or_cancel(*aws: Any) -> list[Any]:
    """asyncio.gather, except that when one task fails (a full disk, a dead server) the others are
    cancelled and awaited: no task is left running, and none dies later with an exception nobody
    retrieves (asyncio would print its traceback at exit)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
