"""A long list of cases kept on disk, not in memory: a trace of a million requests is a million
prompts (gigabytes as objects), built once as the trace is read and read back one at a time
whenever the run goes over its cases (grader checks, the ledger's case rows, each variant's
sends). It is a `Sequence`, so every reader that iterates, counts or indexes cases takes it as
it takes a list."""

from __future__ import annotations

import os
import tempfile
import weakref
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from .dataset import Case


class SpooledCases(Sequence[Case]):
    """Cases as JSON lines in a temporary file (removed when this object goes), with each line's
    byte offset: ``len`` and indexing cost nothing, iteration parses one case at a time."""

    def __init__(self, cases: Iterable[Case], directory: str | None = None) -> None:
        fd, self._path = tempfile.mkstemp(prefix="evalkit-cases-", suffix=".jsonl", dir=directory)
        self._done = weakref.finalize(self, _remove, self._path)
        self._starts = array("q")
        pos = 0
        with os.fdopen(fd, "wb") as f:
            for c in cases:
                # the case's dataset line travels with it: errors keep naming file:line
                line = b"%d\t" % c._line + c.model_dump_json(by_alias=True).encode() + b"\n"
                self._starts.append(pos)
                f.write(line)
                pos += len(line)
        self._starts.append(pos)  # the end of the last line

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __iter__(self) -> Iterator[Case]:
        with open(self._path, "rb") as f:  # a handle per pass: passes may nest
            for line in f:
                yield _case(line)

    @overload
    def __getitem__(self, i: int) -> Case: ...
    @overload
    def __getitem__(self, i: slice) -> list[Case]: ...

    def __getitem__(self, i: int | slice) -> Case | list[Case]:
        if isinstance(i, slice):  # a slice is a (short) list: only small prefixes are cut from a trace
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("case index out of range")
        i %= n
        with open(self._path, "rb") as f:
            f.seek(self._starts[i])
            return _case(f.read(self._starts[i + 1] - self._starts[i]))


def _case(line: bytes) -> Case:
    lineno, _, doc = line.partition(b"\t")
    case = Case.model_validate_json(doc)
    case._line = int(lineno)
    return case


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
