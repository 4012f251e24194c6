"""The mark on every Ledger method that writes: a failed write (a full disk, a read-only file, a
lock held too long) becomes one LedgerWriteError naming the ledger, never a traceback through the
runner; and a mirrored ledger (a Ray worker's) forwards exactly the methods that carry the mark."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..errors import LedgerWriteError

F = TypeVar("F", bound=Callable[..., Any])


def utcnow() -> str:
    """Now, UTC, to the millisecond: every timestamp the ledger stores."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _write(fn: F) -> F:
    """A ledger write that fails (a full disk, a read-only file, a lock held too long) becomes one
    LedgerWriteError naming the ledger, never a traceback through the runner."""

    @functools.wraps(fn)
    def wrapped(self: Any, *a: Any, **kw: Any) -> Any:
        try:
            return fn(self, *a, **kw)
        except sqlite3.OperationalError as e:
            raise LedgerWriteError(f"{self.path}: cannot write the ledger ({e})") from None

    wrapped.ledger_write = True  # type: ignore[attr-defined]  # a mirrored ledger forwards every one of these
    return wrapped  # type: ignore[return-value]


