"""DuckDB runs in a process of its own: the query worker.

DuckDB reads the ledger through its sqlite extension, which carries its own copy of SQLite. Two
copies of SQLite in one process must never open the same database file (sqlite.org/howtocorrupt,
"Multiple copies of SQLite linked into the same application"): POSIX locks belong to the process,
so when DuckDB's copy closes its descriptors, the locks of the process's own connection (a
reader's WAL lock, a writer's, the lock that tells other processes it is there) go with them.
Measured here: after a DuckDB query, another process could take the `-shm` lock a connection of
ours still held; a second `evalkit report` then reset the WAL index under the first, which read
wrong figures once and died of SIGBUS twice. So every query goes to a child process that opens
the ledger through DuckDB only, one `duck.Duck` a query (DuckDB keeps a query's memory until its
connection closes), while this process keeps its own connection; across processes SQLite's
locking holds as it always does.

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
    stopped by `close`. ``peak_kb``: the worker's peak resident memory so far (its own, apart
    from this process's), what the benchmarks add to the command's."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.err: IO[bytes] | None = None
        self.peak_kb = 0
        self.streaming = False

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

    def _ask(self, sql: Any, params: dict[str, Any] | None, chunk: int | None) -> None:
        if self.streaming:  # its replies are still on the pipe
            raise LedgerError(f"{self.path}: a query while a stream of rows is read")
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            _send(self.proc.stdin, (sql, params or {}, chunk))
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


def serve(path: str) -> None:
    """The worker: a query a frame, each on a DuckDB connection of its own, until end of input."""
    import resource

    from .duck import MEMORY_LIMIT, RETRY_LIMITS, Duck

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    def send(kind: str, payload: Any) -> None:
        _send(out, (kind, payload, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))

    while (request := _receive(inp)) is not None:
        sql, params, chunk = request
        sent = False  # a chunk of a stream gone: what fails after it is not retried
        for limit in (MEMORY_LIMIT, *RETRY_LIMITS):  # a larger pool only for what did not fit
            try:
                with Duck(path, limit) as duck:
                    if chunk is None:
                        got = [duck.columns(s, params) for s in sql] if isinstance(sql, list) else duck.columns(sql, params)
                    else:
                        for s in sql[:-1]:
                            duck.columns(s, params)
                        cur = duck.cursor(sql[-1], params)
                        while rows := cur.fetchmany(chunk):
                            send("rows", rows)
                            sent = True
                        got = None
                    reply: tuple[str, Any] = ("ok", got)
                break
            except Exception as e:  # the caller raises it, naming the ledger
                reply = ("error", f"{type(e).__name__}: {e}".splitlines()[0])
                if type(e).__name__ != "OutOfMemoryException" or sent:
                    break
        send(*reply)


if __name__ == "__main__":  # `python -m evalkit.ledger.duck_worker PATH`, by hand
    serve(sys.argv[1])
