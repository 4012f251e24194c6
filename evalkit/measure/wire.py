"""A streaming HTTP/1.1 client whose clock is the kernel's: each read carries the time the packet
reached the socket (`SO_TIMESTAMPNS`, read with `recvmsg` from the event loop's reader callback),
not the time the event loop got round to it. Under thousands of streams a Python client's loop
falls behind; user-space stamps then put the client's own queue into TTFT, kernel stamps do not.

Scope: plain `http://` on Linux. TLS, other platforms, or a socket that refuses the option fall
back to aiohttp (`client.stream_chat`), and each row says which clock it used
(`timestamp_source`). A read may hold several SSE events when the loop was late by more than
the gap between them; they share the newest one's receive time, and each row records how many
events its first token's read held (`first_read_chunks`): TTFT is exact when that is 1.

HTTP/1.1 as servers speak it: keep-alive with a connection pool (a stale pooled connection is
retried once on a fresh one, before any byte of an answer arrived), chunked transfer encoding,
Content-Length and read-until-close bodies, error bodies with Retry-After, and every fault class
of the aiohttp path (connect_error, stream_cut, timeout, malformed_stream, empty_completion).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from ..ledger import utcnow
from .client import RequestResult, StreamParser, classify_end, retry_after

SO_TIMESTAMPNS = 35  # Linux (asm-generic/socket.h); the control message type is the same number
ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # struct timespec
# Bytes per recvmsg. Until a stream's first token has arrived, reads stay smaller than one SSE
# event, so the read that brings an event's first byte touches only that event's TCP segment and
# carries its receive time even when the loop was late and later segments wait behind it; after
# the first token, large reads keep the cost of thousands of streams low.
READ_PRECISE = 64
READ_BULK = 65536
MAX_READS_PER_CALLBACK = 64


def kernel_stamps_supported() -> bool:
    return sys.platform.startswith("linux") and ANC_SIZE > 0


_KEEPER: list[socket.socket] = []  # held for the process's life: keeps the kernel stamping


def kernel_stamps_ready(wait_s: float = 0.5) -> bool:
    """Whether TCP reads here carry kernel receive times, waiting up to `wait_s` for them to start.
    Linux turns receive stamping on for the whole machine only after the first socket asks, from a
    deferred work item; packets that arrive before it ran have no stamp. A loopback connection that
    asks, and stays open, turns it on before the first real request, and its reads say when it has."""
    if _KEEPER:
        return True
    if not kernel_stamps_supported():
        return False
    srv = socket.socket()
    try:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = socket.create_connection(srv.getsockname(), timeout=1.0)
        cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        peer, _ = srv.accept()
    except OSError:
        srv.close()
        return False
    srv.close()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            peer.sendall(b"x")
            _data, anc, _flags, _addr = cli.recvmsg(16, ANC_SIZE)
        except OSError:
            anc = []
        if any(lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS for lvl, typ, _ in anc):
            peer.close()
            _KEEPER.append(cli)
            return True
        if time.monotonic() > deadline:
            peer.close()
            cli.close()
            return False
        time.sleep(0.005)


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME minus perf_counter at one instant (the best of five samples): turns a
    kernel receive time into the run's perf_counter clock."""
    best: tuple[int, int] | None = None
    for _ in range(5):
        a = time.perf_counter_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    assert best is not None
    return best[1]


class WireError(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class Connection:
    """One TCP connection read through the loop's reader callback with kernel receive times."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, key: tuple[str, int],
                 stamped: bool = True) -> None:
        self.loop, self.sock, self.key = loop, sock, key
        self.stamped = stamped  # the socket asked for receive times
        self.reads: deque[tuple[bytes, float, float]] = deque()  # data, receive time (s), user time (s)
        self.eof = False
        self.error: OSError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.kernel = stamped
        self.offset_ns = realtime_offset_ns()
        self.used = 0  # requests served
        self.read_size = READ_PRECISE
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        for _ in range(MAX_READS_PER_CALLBACK):
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(self.read_size, ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.error = e
                self._close_reader()
                break
            user = time.perf_counter()
            when = None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    when = (sec * 1_000_000_000 + nsec - self.offset_ns) / 1e9
            if not data:
                self.eof = True
                self._close_reader()
                break
            if when is None:
                self.kernel = False  # the option was refused: this read's time is user space
            self.reads.append((data, when if when is not None else user, user))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _close_reader(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            pass

    async def read(self) -> tuple[bytes, float, float] | None:
        """The next read (data, receive time, user time), or None at end of stream."""
        while not self.reads:
            if self.error is not None:
                raise self.error
            if self.eof:
                return None
            self.waiter = self.loop.create_future()
            await self.waiter
            self.waiter = None
        return self.reads.popleft()

    def close(self) -> None:
        self._close_reader()
        try:
            self.sock.close()
        except OSError:
            pass


class Response:
    """Status line and headers parsed from the first reads; the body comes through `body()`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.pending = b""  # body bytes that arrived with the headers
        self.pending_at = (0.0, 0.0)
        self.complete = False  # the body's framing ended (the connection may be reused)
        self._body: Any = None

    async def read_head(self) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = await self.conn.read()
            if got is None:
                raise WireError("connect_error" if not buf else "stream_cut",
                                "the server closed the connection before answering" if not buf
                                else "the connection closed in the middle of the response headers")
            buf += got[0]
            self.pending_at = got[1:]
        head, _, self.pending = buf.partition(b"\r\n\r\n")
        if not self.pending and self.conn.stamped:
            self.conn.kernel = True  # the head's own receive time times nothing
        lines = head.decode("latin-1").split("\r\n")
        try:
            self.status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise WireError("malformed_stream", f"not an HTTP status line: {lines[0][:80]!r}") from None
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    def body(self):  # type: ignore[no-untyped-def]
        """The decoded body as (bytes, receive time, user time), read by read. One generator per
        response: iterating again after a break goes on where it stopped."""
        if self._body is None:
            self._body = self._decode()
        return self._body

    async def _more(self) -> tuple[bytes, float, float] | None:
        return await self.conn.read()

    async def _decode(self):  # type: ignore[no-untyped-def]
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = int(self.headers["content-length"]) if "content-length" in self.headers and not chunked else None
        buf, at = self.pending, self.pending_at
        self.pending = b""
        if not chunked:
            got = 0
            while True:
                if buf:
                    if length is not None:
                        buf = buf[: length - got]
                    got += len(buf)
                    yield buf, at[0], at[1]
                if length is not None and got >= length:
                    self.complete = True
                    return
                r = await self._more()
                if r is None:
                    if length is not None:
                        raise WireError("stream_cut", f"the connection closed after {got} of {length} body bytes")
                    return  # a body delimited by the connection's end
                buf, at = r[0], r[1:]
        state, need = "size", 0  # size line -> data (need bytes) -> CRLF -> size line ... -> 0 -> done
        while True:
            out: list[bytes] = []
            i, n = 0, len(buf)  # walk the buffer by index: no copy of the rest per chunk
            while i < n:
                if state == "size":
                    j = buf.find(b"\r\n", i)
                    if j < 0:
                        break
                    try:
                        need = int(buf[i:j].split(b";")[0].strip() or b"0", 16)
                    except ValueError:
                        raise WireError("malformed_stream", f"bad chunk size line {buf[i:j][:40]!r}") from None
                    i = j + 2
                    state = "data" if need else "done"
                    if not need:
                        break
                elif state == "data":
                    take = min(need, n - i)
                    out.append(buf[i:i + take])
                    i += take
                    need -= take
                    if need == 0:
                        state = "crlf"
                elif state == "crlf":
                    if n - i < 2:
                        break
                    i += 2
                    state = "size"
            buf = buf[i:]
            if out:
                yield b"".join(out), at[0], at[1]
            if state == "done":  # the last chunk; its trailer (usually an empty line) may follow
                self.complete = True
                return
            r = await self._more()
            if r is None:
                raise WireError("stream_cut", "the connection closed in the middle of a chunked body")
            buf, at = buf + r[0], r[1:]


class WireClient:
    """Connections pooled per host and port, for one event loop."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list[Connection]] = {}
        self.stamps = kernel_stamps_ready()

    async def _connect(self, host: str, port: int) -> Connection:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamped = self.stamps
        if stamped:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                stamped = False
        try:
            await loop.sock_connect(sock, (host, port))
        except OSError as e:
            sock.close()
            raise WireError("connect_error", f"cannot connect to {host}:{port}: {e}") from None
        return Connection(loop, sock, (host, port), stamped)

    async def _conn(self, key: tuple[str, int]) -> tuple[Connection, bool]:
        pool = self.idle.get(key) or []
        while pool:
            c = pool.pop()
            if not c.eof and c.error is None:
                return c, True
            c.close()
        return await self._connect(*key), False

    def release(self, conn: Connection, reusable: bool) -> None:
        if reusable and not conn.eof and conn.error is None and not conn.reads:
            self.idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for pool in self.idle.values():
            for c in pool:
                c.close()
        self.idle.clear()

    async def open(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[Response, float]:
        """Send a POST and read the response head; returns it and the send time (perf_counter s)."""
        u = urlsplit(url)
        key = (u.hostname or "127.0.0.1", u.port or 80)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        head = [f"POST {path} HTTP/1.1", f"Host: {key[0]}:{key[1]}", "Content-Type: application/json",
                "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        req = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for attempt in (0, 1):
            conn, reused = await self._conn(key)
            loop = asyncio.get_running_loop()
            conn.read_size = READ_PRECISE  # until this response's first token
            conn.kernel = conn.stamped  # per request: says whether this response's reads were stamped
            conn.offset_ns = realtime_offset_ns()  # per request: a clock step must not shift every later stamp
            try:
                # stamped before the send: the send wakes the server, which may take this core before
                # the call returns, and a stamp after it would then start TTFT after the server did
                sent = time.perf_counter()
                await loop.sock_sendall(conn.sock, req)
                resp = Response(conn)
                await resp.read_head()
                conn.used += 1
                return resp, sent
            except (WireError, OSError) as e:
                conn.close()
                # an idle pooled connection the server had closed: nothing was answered, try a fresh one
                if reused and attempt == 0 and (not isinstance(e, WireError) or e.error_class == "connect_error"):
                    continue
                if isinstance(e, WireError):
                    raise
                raise WireError("connect_error", f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")


async def stream_chat_wire(wire: WireClient, url: str, payload: dict[str, Any], *, headers: dict[str, str] | None = None,
                           timeout_s: float = 600.0, epoch: float | None = None) -> RequestResult:
    """`client.stream_chat` over the kernel-stamped client: the same result, the same error
    classes, with `timestamp_source` saying which clock timed it."""
    res = RequestResult(started_at=utcnow())
    t0 = time.perf_counter()
    parser = StreamParser(res, t0)
    resp: Response | None = None

    async def go() -> None:
        nonlocal resp, t0
        resp, sent = await wire.open(url, json.dumps(payload).encode(), headers or {})
        t0 = parser.t0 = sent  # TTFT and E2E run from the moment the request left
        if epoch is not None:
            res.mono_start_ms = (t0 - epoch) * 1000
        res.http_status = resp.status
        if resp.status != 200:
            res.retry_after_s = retry_after(resp.headers.get("retry-after"))
            chunks = [b async for b, _, _ in resp.body()]
            res.error_class = f"http_{resp.status}"
            res.error = b"".join(chunks).decode("utf-8", "replace")[:2000]
            return
        async for data, when, user in resp.body():
            if parser.feed(data, when, user):
                break
            if res.chunk_offsets_ms:
                resp.conn.read_size = READ_BULK

    try:
        await asyncio.wait_for(go(), timeout_s)
    except asyncio.TimeoutError:
        res.error_class = "timeout"
        res.error = f"no complete answer within {timeout_s:g} s"
    except WireError as e:
        res.error_class = e.error_class if res.http_status is None or e.error_class != "connect_error" else "stream_cut"
        res.error = str(e)[:500]
    except OSError as e:  # e.g. a reset: after the headers it cut a stream, before them it failed to connect
        res.error_class = "stream_cut" if res.http_status is not None else "connect_error"
        res.error = f"{type(e).__name__}: {e}"[:500]
    end = time.perf_counter()
    if resp is not None:
        res.timestamp_source = "kernel" if resp.conn.kernel else "user"
        answered = res.error_class is None and parser.done  # or an HTTP error whose body was read whole
        reusable = resp.keep_alive and (answered or (res.error_class or "").startswith("http_"))
        if reusable and not resp.complete:
            reusable = await _drain(resp)
        wire.release(resp.conn, reusable)
    if epoch is not None and res.mono_start_ms is None:
        res.mono_start_ms = (t0 - epoch) * 1000
    parser.finish(end)  # E2E: to the kernel receive time of the read that ended the stream
    classify_end(res, parser.done)
    return res


async def _drain(resp: Response) -> bool:
    """Read what is left of a body after [DONE] (the chunked terminator), so the connection can be
    reused; give up quickly if it does not come."""
    try:
        async def rest() -> None:
            async for _ in resp.body():
                pass

        await asyncio.wait_for(rest(), 0.5)
    except (asyncio.TimeoutError, WireError, OSError):
        return False
    return resp.complete
