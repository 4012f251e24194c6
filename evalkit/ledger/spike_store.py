"""A run's spikes outside the process's memory: a private temporary SQLite database (SQLite's own
temporary file, deleted when closed) that the report's spike lists and counts query
(`reporting.spike_summary`)."""

from __future__ import annotations

import sqlite3
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# what a spike says: the report's `Spike` keys (its line last, written from the rest)
SPIKE_COLUMNS = ("request_id", "variant", "complexity", "case_id", "concurrency", "metric", "value", "slice_median",
                 "robust_z", "cause", "evidence", "line")


class Spikes:
    """A run's spikes, every one a row of a private temporary SQLite database (on disk, deleted when
    closed): a 10 M-row run has 10^5 of them and the report holds none; its lists and counts are
    queries. Iterating gives them as dicts in the findings' order (TTFT's, then E2E's)."""

    COLUMNS = SPIKE_COLUMNS

    def __init__(self, spikes: Iterable[Mapping[str, Any]] = ()) -> None:
        self._db = sqlite3.connect("", check_same_thread=False)  # "": SQLite's own temporary file
        self._db.execute(f"create table s (ord integer primary key, {', '.join(self.COLUMNS)})")
        self._close = weakref.finalize(self, self._db.close)
        self.add(spikes)

    def add(self, spikes: Iterable[Mapping[str, Any]]) -> None:
        """Append spikes (a `Spike` or a dict with the keys it has; the rest None), taken as inserted."""
        with self._db:
            self._db.executemany(f"insert into s ({', '.join(self.COLUMNS)}) values ({', '.join('?' * len(self.COLUMNS))})",
                                 (tuple(sp.get(k) for k in self.COLUMNS) for sp in spikes))

    def close(self) -> None:
        self._close()

    def __len__(self) -> int:
        return int(self._db.execute("select count(*) from s").fetchone()[0])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._dicts("order by ord")

    def _dicts(self, order: str, *args: Any) -> Iterator[dict[str, Any]]:
        """Every column of the spikes in ``order`` (an ORDER BY clause, a LIMIT after it), as dicts."""
        for r in self._db.execute(f"select {', '.join(self.COLUMNS)} from s {order}", args):
            yield dict(zip(self.COLUMNS, r, strict=True))

    def largest(self, n: int) -> list[dict[str, Any]]:
        """The ``n`` largest by robust z (ties: in their order in the findings)."""
        return list(self._dicts("order by robust_z desc, ord limit ?", n))

    def request_ids(self) -> list[int]:
        return [r[0] for r in self._db.execute("select request_id from s order by ord")]

    def counts(self) -> list[dict[str, Any]]:
        """How many per variant x level x complexity x metric x cause, largest counts first."""
        got = self._db.execute("select variant, concurrency, complexity, coalesce(metric, ''), cause, count(*) from s "
                               "group by 1, 2, 3, 4, 5").fetchall()
        return [{"variant": v, "concurrency": lv, "complexity": cx, "metric": m, "cause": cause, "n": n}
                for v, lv, cx, m, cause, n in sorted(got, key=lambda r: (-r[5], *map(str, r[:5])))]
