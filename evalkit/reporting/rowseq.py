"""A report's rows as a list that makes each row's view when it is read (`Rows`), and the view
(`Row`): a read-only mapping onto the row's place in a `rows.Table`.

A view held for every row of a slice is ~92 bytes a row (the object, its index, the list's
pointer): 20 MB of a 222k-row slice, 40 MB while a candidate's slice sits beside the baseline's.
Read from the ledger, `Rows` holds the table and which of its rows it lists (4 bytes a row, or
nothing for all of them) and makes a row's view as it is reached; a reader that keeps some rows
(`where`, `take`) or groups them (`selection.by_variant`) gets the same kind of list. Anything that
changes the list turns it into a plain list of views first, so every list operation keeps its
meaning."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import compress, repeat
from typing import Any

import numpy as np

# a `rows.Table` (not imported: it imports this) and its rows listed (None: every row, in order)
Part = tuple[Any, "np.ndarray | None"]
Table = Any


class Row(Mapping[str, Any]):
    """One report row: a read-only mapping onto its place in the `Table`."""

    __slots__ = ("_g", "_t", "_i")

    def __init__(self, table: Table, i: int) -> None:
        self._g, self._t, self._i = table.get, table, i

    def __getitem__(self, key: str) -> Any:
        return self._g[key](self._i)

    def get(self, key: str, default: Any = None) -> Any:
        f = self._g.get(key)
        return default if f is None else f(self._i)

    def __contains__(self, key: object) -> bool:
        return key in self._g

    def __iter__(self) -> Iterator[str]:
        return iter(self._t.keys)

    def __len__(self) -> int:
        return len(self._t.keys)

    def __repr__(self) -> str:
        return repr(dict(self))


def _places(t: Table, idx: np.ndarray | None) -> Iterable[int]:
    return range(t.n) if idx is None else idx.tolist()


def _mutator(name: str) -> Any:
    method = getattr(list, name)

    def call(self: Rows, *args: Any, **kwargs: Any) -> Any:
        self._own()
        return method(self, *args, **kwargs)

    call.__name__ = name
    return call


class Rows(list):  # type: ignore[type-arg]
    """A run's report rows. A list, so every reader works on it and on any slice of it, plus a
    memo for what several readers derive from the same rows (see `selection`). Made by `of`, it
    lists rows of tables (``parts``) and makes each row's `Row` when it is read."""

    memo: dict[str, Any]
    parts: list[Part] | None  # None: a plain list of rows (made by hand, or changed since)

    def __init__(self, rows: Any = ()) -> None:
        super().__init__(rows)
        self.memo = {}
        self.parts, self._n = None, 0

    @classmethod
    def of(cls, parts: Iterable[Part]) -> Rows:
        """The rows ``parts`` list, in order: each part a table and its rows' places (None: all)."""
        out = cls()
        out.parts = [(t, None if idx is None else np.asarray(idx, dtype=np.int32)) for t, idx in parts]
        out._n = sum(t.n if idx is None else int(idx.size) for t, idx in out.parts)
        return out

    @staticmethod
    def chain(*lists: list[Any]) -> Rows:
        """The lists one after the other: views of their tables when every one is, else a plain list."""
        if all(isinstance(x, Rows) and x.parts is not None for x in lists):
            return Rows.of([p for x in lists for p in x.parts])  # type: ignore[union-attr]
        return Rows([r for x in lists for r in x])

    def where(self, keep: Iterable[bool]) -> Rows:
        """The rows whose flag in ``keep`` (one per row, in order) is true, as a list of the same kind."""
        if self.parts is None:
            return Rows(compress(self, keep))
        flags = np.fromiter(keep, dtype=bool, count=self._n)
        return self.take(np.flatnonzero(flags))

    def take(self, positions: Iterable[int]) -> Rows:
        """The rows at ``positions`` (places in this list, in the order given), as a list of the same kind."""
        pos = np.asarray(positions if isinstance(positions, np.ndarray) else list(positions), dtype=np.int64)
        if self.parts is None:
            return Rows(map(list.__getitem__, repeat(self), pos.tolist()))
        out, start = [], 0
        for t, idx in self.parts:
            n = t.n if idx is None else int(idx.size)
            mine = pos[(pos >= start) & (pos < start + n)] - start
            if mine.size:
                out.append((t, mine if idx is None else idx[mine]))
            start += n
        if len(self.parts) > 1 and pos.size > 1 and np.any(np.diff(pos) < 0):
            return Rows(self[int(i)] for i in pos.tolist())  # not in order across parts: plain
        return Rows.of(out)

    def groups(self, key: str) -> dict[Any, Rows]:
        """``key``'s value -> its rows in order (values in the order first met), each list of the same kind."""
        if self.parts is None:
            plain: dict[Any, Rows] = {}
            for r in self:
                plain.setdefault(r[key], Rows()).append(r)
            return plain
        out: dict[Any, list[Part]] = {}
        for t, idx in self.parts:
            get, places = t.get[key], np.arange(t.n) if idx is None else idx
            mine: dict[Any, list[int]] = {}
            for k, v in enumerate(map(get, places.tolist())):
                mine.setdefault(v, []).append(k)
            for v, ks in mine.items():
                out.setdefault(v, []).append((t, places[np.asarray(ks, dtype=np.int64)]))
        return {v: Rows.of(ps) for v, ps in out.items()}

    def _own(self) -> None:
        """From views made when read to a plain list of them (before the list is changed)."""
        if self.parts is not None:
            rows = list(self._views())
            self.parts, self._n = None, 0
            list.extend(self, rows)

    def _views(self) -> Iterator[Row]:
        for t, idx in self.parts or ():
            yield from map(Row, repeat(t), _places(t, idx))

    def __len__(self) -> int:
        return self._n if self.parts is not None else list.__len__(self)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Any]:
        return self._views() if self.parts is not None else list.__iter__(self)

    def __reversed__(self) -> Iterator[Any]:
        return reversed(list(self)) if self.parts is not None else list.__reversed__(self)

    def __getitem__(self, k: Any) -> Any:
        if self.parts is None:
            return list.__getitem__(self, k)
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        i = k + self._n if k < 0 else k
        if not 0 <= i < self._n:
            raise IndexError("list index out of range")
        for t, idx in self.parts:
            n = t.n if idx is None else int(idx.size)
            if i < n:
                return Row(t, i if idx is None else int(idx[i]))
            i -= n
        raise IndexError("list index out of range")  # pragma: no cover (sizes add up)

    def __contains__(self, x: object) -> bool:
        return any(r == x for r in self) if self.parts is not None else list.__contains__(self, x)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, list) else NotImplemented  # type: ignore[call-overload]

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Any) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Any) -> list[Any]:
        return [*other, *self]

    def __mul__(self, k: Any) -> list[Any]:
        return list(self) * k

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return repr(list(self))

    def copy(self) -> list[Any]:  # type: ignore[override]
        return list(self)

    def index(self, x: Any, *args: Any) -> int:  # type: ignore[override]
        return list(self).index(x, *args)

    def count(self, x: Any) -> int:  # type: ignore[override]
        return list(self).count(x)

    for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                  "__setitem__", "__delitem__", "__iadd__", "__imul__"):
        locals()[_name] = _mutator(_name)
    del _name


def where(rows: list[Any], keep: Iterable[bool]) -> list[Any]:
    """`Rows.where` of any list of rows (a plain list: a plain list back)."""
    return rows.where(keep) if isinstance(rows, Rows) else list(compress(rows, keep))


def take(rows: list[Any], positions: Iterable[int]) -> list[Any]:
    """`Rows.take` of any list of rows (a plain list: a plain list back)."""
    return rows.take(positions) if isinstance(rows, Rows) else [rows[i] for i in positions]


def succeeded(rows: list[Any]) -> list[Any]:
    """The rows whose request succeeded (``error_class`` NULL), as a list of the same kind: of rows
    read from the ledger, from the column itself (no view made to ask)."""
    if isinstance(rows, Rows) and rows.parts is not None:
        keep = []
        for t, idx in rows.parts:
            ok = t.columns["error_class"].nulls()
            keep.append((t, np.flatnonzero(ok) if idx is None else idx[ok[idx]]))
        return Rows.of(keep)
    return [r for r in rows if r["error_class"] is None]
