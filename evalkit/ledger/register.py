"""The register of open ledgers: id -> (path, the code that opened it). `Ledger` adds itself when
made and leaves when closed; one collected while still open is kept in `LEAKED`. The test suite
fails a test whose command leaves a ledger open (tests/conftest.py)."""

from __future__ import annotations

import sys
import weakref
from typing import Any

_OPEN: dict[int, tuple[str, str]] = {}
LEAKED: list[tuple[str, str]] = []  # ledgers collected while still open (nobody closed them)


def _opener() -> str:
    f: Any = sys._getframe(2)
    while f is not None and f.f_code.co_filename.endswith(("ledger/store.py", "ledger/mirror.py", "ledger/opening.py",
                                                             "ledger/register.py")):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"


def _collected(key: int) -> None:
    if key in _OPEN:
        LEAKED.append(_OPEN.pop(key))


def track(ledger: Any, path: str) -> None:
    if path == ":memory:":
        return  # nothing on disk to hold
    _OPEN[id(ledger)] = (path, _opener())
    weakref.finalize(ledger, _collected, id(ledger))


def untrack(ledger: Any) -> None:
    _OPEN.pop(id(ledger), None)


def is_open(ledger: Any) -> bool:
    return id(ledger) in _OPEN


def open_ledgers() -> list[tuple[str, str]]:
    """(path, opened where) of every ledger this process has open."""
    return list(_OPEN.values())
