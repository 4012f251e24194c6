"""DuckDB runs in a process of its own: the query worker.

DuckDB reads the ledger through its sqlite extension, which carries its own copy of SQLite. Two
copies of SQLite in one process must never open the same database file (sqlite.org/howtocorrupt,
"Multiple copies of SQLite linked into the same application"): POSIX locks belong to the process,
so when DuckDB's copy closes its descriptors, the locks of the process's own connection (a
reader's WAL lock, a writer's, the lock that tells other processes it is there) go with them.
Measured here: after a DuckDB query, another process could take the `-shm` lock a connection of
ours still held; a second `evalkit report` then reset the WAL index under the first, which read
wrong figures once and died of SIGBUS twice. So every query goes to a child process that opens
the ledger through DuckDB only, one `duck.Duck` at a time (kept for the next query, cleared, while
the ledger is the same file in the same state), while this process keeps its own connection;
across processes SQLite's locking holds as it always does.

The child is started plainly (no Python between fork and exec, `spawn.with_parent_death`), reads
(SQL, parameters) frames on stdin and answers each with its result or its error, and exits at end
of input: when its `QueryWorker` closes (with the `Ledger`), is collected unclosed, or this
process dies."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import LedgerError

if TYPE_CHECKING:
    from .duck import PerGroup

_HEAD = struct.Struct("<Q")
MODULE = "evalkit.ledger.duck_worker"
# the workers now running in this process: what the test suite ends after each test (a test's own
# ledger left unclosed would keep its worker, ~70 MB, until the session ends)
RUNNING: weakref.WeakSet[QueryWorker] = weakref.WeakSet()
# The child imports this module and `duck` alone: `evalkit.ledger`'s own imports (sqlite-utils, every
# reader of the ledger) are stood in for by an empty package, ~25 MB less in every worker.
_BOOT = ("import sys, types, pathlib, evalkit; pkg = types.ModuleType('evalkit.ledger'); "
         "pkg.__path__ = [str(pathlib.Path(evalkit.__file__).parent / 'ledger')]; sys.modules['evalkit.ledger'] = pkg; "
         f"import {MODULE} as w; w.serve(sys.argv[1])")


def _send(out: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_HEAD.pack(len(data)))
    out.write(data)
    out.flush()


def _receive(inp: IO[bytes]) -> Any:
    """The next frame, or None at end of input."""
    head = inp.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    (n,) = _HEAD.unpack(head)
    data = inp.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)  # noqa: S301  (our own child's frames, over its own pipe)


class QueryWorker:
    """This process's side of the query worker for one ledger file: started at the first query,
    stopped by `close`; the queries of a `session` share one connection. ``peak_kb``: the worker's
    peak resident memory so far (its own, apart from this process's), what the benchmarks add to
    the command's."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.err: IO[bytes] | None = None
        self.peak_kb = 0
        self.streaming = False
        self.in_session = False

    def columns(self, sql: str | list[str | PerGroup], params: dict[str, Any] | None = None) -> Any:
        """(column names, rows) of ``sql`` (`duck.Duck.columns`), run by the worker; for a list of
        statements, theirs in a list, run in order on one connection (a temp table the first makes
        is the later ones' to read)."""
        self._ask(sql, params, None)
        return self._answer()

    def stream(self, sqls: list[str | PerGroup], params: dict[str, Any] | None = None, chunk: int = 10_000
               ) -> Iterator[tuple[Any, ...]]:
        """The rows of the last of ``sqls`` (the others run before it on its connection), ``chunk``
        at a time: neither process holds them all (132,000 spikes of 17 columns: ~100 MB in each)."""
        self._ask(sqls, params, chunk)
        done, self.streaming = False, True
        try:
            while True:
                try:
                    rows = self._answer(more=True)
                except LedgerError:  # its last reply (an error, or the worker gone)
                    done = True
                    raise
                if rows is None:
                    done = True
                    break
                yield from rows
        finally:
            try:
                while not done:  # a caller that stopped early: the rest is read, the pipe stays in step
                    done = self._answer(more=True) is None
            finally:
                self.streaming = False

    @contextmanager
    def session(self) -> Iterator[None]:
        """Every query in the block on one DuckDB connection, kept between them: a temp table one
        call makes, a later call reads (a call whose statements depend on what Python made of an
        earlier one's rows). Its memory is the worker's until the block ends. A statement that runs
        out of memory is retried on a larger pool with the session's tables made again. Nested:
        the outer block's."""
        if self.in_session:
            yield
            return
        self.in_session = True
        try:
            yield
        finally:
            self.in_session = False
            if self.proc is not None and not self.streaming:
                try:
                    self._ask(None, None, None)  # the connection closes; nothing else comes back
                    self._answer()
                except LedgerError:  # a worker already gone: the next query starts another
                    pass

    def _ask(self, sql: Any, params: dict[str, Any] | None, chunk: int | None) -> None:
        if self.streaming:  # its replies are still on the pipe
            raise LedgerError(f"{self.path}: a query while a stream of rows is read")
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            _send(self.proc.stdin, (sql, params or {}, chunk, self.in_session))
        except BrokenPipeError:
            raise LedgerError(f"{self.path}: the query worker stopped ({self._death()})") from None

    def _answer(self, more: bool = False) -> Any:
        """The next reply's payload (with ``more``: a chunk of rows, or None at the stream's end)."""
        assert self.proc is not None and self.proc.stdout is not None
        reply = _receive(self.proc.stdout)
        if reply is None:
            raise LedgerError(f"{self.path}: the query worker stopped ({self._death()})")
        kind, payload, peak = reply
        self.peak_kb = max(self.peak_kb, peak)
        if kind == "error":
            raise LedgerError(f"{self.path}: query failed: {payload}")
        if more:
            return payload if kind == "rows" else None
        return payload

    def _start(self) -> None:
        from ..spawn import with_parent_death

        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(with_parent_death([sys.executable, "-c", _BOOT, self.path]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     start_new_session=True)
        RUNNING.add(self)
        weakref.finalize(self, _hang_up, self.proc)  # a worker whose ledger was never closed

    def _death(self) -> str:
        from ..spawn import reap

        assert self.proc is not None and self.err is not None
        code = reap(self.proc, 5)
        self.err.seek(0)
        tail = [line for line in self.err.read().decode(errors="replace").splitlines() if line.strip()]
        self.close()
        return f"exit code {code}" + (f": {tail[-1]}" if tail else "")

    def close(self) -> None:
        """End the worker (idempotent): its input closes, it exits; killed if it does not."""
        proc, self.proc = self.proc, None
        RUNNING.discard(self)
        if proc is not None:
            from ..spawn import reap

            _hang_up(proc)
            reap(proc, 10)
        if self.err is not None:
            self.err.close()
            self.err = None


def _hang_up(proc: subprocess.Popen[bytes]) -> None:
    """Close this side of a collected worker's pipes: it reads end of input and exits. Without it a
    ledger left unclosed kept its worker for the life of the process (`subprocess` keeps a running
    child's `Popen`, and with it the pipe, to reap it later)."""
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            try:
                f.close()
            except BrokenPipeError:  # a dead worker: what a query left in the buffer has nowhere to go
                pass


def _lasting(statement: str | PerGroup) -> bool:
    """Whether a statement leaves something a later one reads (a temp table or view): what a
    session replays on a larger pool."""
    if not isinstance(statement, str):
        return statement.into is not None
    return statement.lstrip().lower().startswith(("create", "insert", "drop"))


def serve(path: str) -> None:
    """The worker: a query a frame, each on a DuckDB connection of its own, until end of input;
    the frames of a session (`QueryWorker.session`) on one connection, kept until it ends."""
    import resource

    from .duck import MEMORY_LIMIT, RETRY_LIMITS, Duck

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    def send(kind: str, payload: Any) -> None:
        _send(out, (kind, payload, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))

    held: Duck | None = None  # a session's connection, the pool it has, and what it made so far
    held_at = 0
    made: list[tuple[Any, dict[str, Any]]] = []
    limits = (MEMORY_LIMIT, *RETRY_LIMITS)
    # The last connection on the first pool, cleared, for the next query while the ledger has not
    # changed: making one (the extension, the ledger and its copy attached, a view a table) is
    # ~130 ms, most of a small ledger's query (a run's machine check: 7 queries, 1.1 s).
    idle: Duck | None = None

    def keep(duck: Duck, at: int) -> None:
        nonlocal idle
        if at == 0 and duck.clear():
            idle = duck
        else:
            duck.close()

    def take() -> Duck | None:
        nonlocal idle
        duck, idle = idle, None
        if duck is not None and not duck.still_fresh(path):
            duck.close()
            return None
        return duck

    while (request := _receive(inp)) is not None:
        sql, params, chunk, session = request
        if not session and held is not None:  # the session ended: its tables go
            keep(held, held_at)
            held, made = None, []
        if sql is None:
            send("ok", None)
            continue
        steps = sql if isinstance(sql, list) else [sql]
        sent = False  # a chunk of a stream gone: what fails after it is not retried
        at = held_at if held is not None else 0
        while True:  # a larger pool only for what did not fit
            duck = held
            try:
                if duck is None:
                    duck = (take() if at == 0 else None) or Duck(path, limits[at])
                    for s, p in made:  # a session's tables, made again on the larger pool
                        duck.columns(s, p)
                if chunk is None:
                    got = [duck.columns(s, params) for s in steps]
                    got = got if isinstance(sql, list) else got[0]
                else:
                    for s in steps[:-1]:
                        duck.columns(s, params)
                    cur = duck.cursor(steps[-1], params)
                    while rows := cur.fetchmany(chunk):
                        send("rows", rows)
                        sent = True
                    got = None
                reply: tuple[str, Any] = ("ok", got)
            except Exception as e:  # the caller raises it, naming the ledger
                reply = ("error", f"{type(e).__name__}: {e}".splitlines()[0])
                if duck is not None:
                    duck.close()
                held = None
                if type(e).__name__ == "OutOfMemoryException" and not sent and at + 1 < len(limits):
                    at += 1
                    continue
                made = []  # a session that failed is over: its later frames start afresh
                break
            if session:
                held, held_at = duck, at
                made += [(s, params) for s in steps if _lasting(s)]
            else:
                keep(duck, at)
            break
        send(*reply)
    for duck in (held, idle):
        if duck is not None:
            duck.close()


if __name__ == "__main__":  # `python -m evalkit.ledger.duck_worker PATH`, by hand
    serve(sys.argv[1])
