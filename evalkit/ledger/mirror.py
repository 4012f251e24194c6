"""A ledger that mirrors its writes: it writes locally (in memory: a Ray worker reads back the few
rows a resume needs) and hands *every* write to a callback as an event, generically: each Ledger
method marked as a write (`store.write_methods()`) is forwarded with its arguments and result,
so a new write method can never be left out. The driver replays the events with `Replay`, the one
process that writes the ledger file, translating the worker's request ids and sequence numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .opening import open_ledger
from .store import Ledger, write_methods

Event = tuple[Any, ...]


class MirroredLedger(Ledger):
    def __init__(self, emit: Callable[[Event], None], path: str = ":memory:") -> None:
        inner = open_ledger(path)
        super().__init__(inner._db, inner.path)
        self.emit = emit

    def seed_run(self, run_row: dict[str, Any], case_rows: list[dict[str, Any]],
                 variant_rows: list[dict[str, Any]] | None = None) -> None:
        """The run, its cases and (on a resume) its variants as the driver has them: rows written
        here join to these, and a resumed variant's status is read from here (local only: the
        driver has them already)."""
        self._db["runs"].insert(run_row)
        Ledger.record_cases(self, case_rows)
        if variant_rows:
            self._db["variants"].insert_all(variant_rows, alter=True)


def _forward(name: str) -> Callable[..., Any]:
    write = getattr(Ledger, name)

    def method(self: MirroredLedger, *a: Any, **kw: Any) -> Any:
        # rows given as they are made (`replace_derived`'s) are made here: both sides read them
        a = tuple(list(x) if isinstance(x, Iterator) else x for x in a)
        # the arguments as they are now: a row the caller goes on updating must not change what was sent
        sent = tuple(dict(x) if isinstance(x, dict) else [dict(r) for r in x] if _rows(x) else x for x in a)
        out = write(self, *a, **kw)
        self.emit(("write", name, sent, kw, out))
        return out

    method.__name__ = method.__qualname__ = name
    method.__doc__ = write.__doc__
    return method


def _rows(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and isinstance(x[0], dict)


for _name in write_methods():
    setattr(MirroredLedger, _name, _forward(_name))


class Replay:
    """Applies one worker's write events to the driver's ledger: the same method with the same
    arguments, except what only the driver can know: request ids (the worker's are local), the
    run-wide sequence number, and the host the worker ran on."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.ids: dict[int, int] = {}  # worker request id -> driver request id
        self.host_id: str | None = None

    def __call__(self, name: str, a: tuple[Any, ...], kw: dict[str, Any], out: Any, next_seq: Callable[[], int]) -> None:
        if name == "insert_requests":  # the worker's batch: each row gets the run-wide sequence number
            self.ledger.insert_requests([{**{k: v for k, v in r.items() if k != "id"}, "seq": next_seq()} for r in a[0]])
        elif name == "insert_request":
            row = {k: v for k, v in a[0].items() if k != "id"}  # the worker's id is its own
            self.ids[out] = self.ledger.insert_request({**row, "seq": next_seq()})
        elif name == "update_request":
            if a[0] in self.ids:
                self.ledger.update_request(self.ids[a[0]], *a[1:], **kw)
        elif name == "upsert_variant":
            self.ledger.upsert_variant({**a[0], "host_id": self.host_id})
        elif name == "insert_grades":
            self.ledger.insert_grades([{**g, "request_id": self.ids.get(g["request_id"], g["request_id"])} for g in a[0]])
        else:
            getattr(self.ledger, name)(*a, **kw)
