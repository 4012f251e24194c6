"""What a resume skips, asked of SQLite rather than held: `DoneKeys` answers "is (variant, case,
repeat, level) already measured in this run?" with one indexed lookup (requests' index on
run_id, variant, case_id, repeat), so a resume of a million-request run holds no million keys."""

from __future__ import annotations

from collections.abc import Iterator

from sqlite_utils import Database

Key = tuple[str, str, int, str]


class DoneKeys:
    """The final measured requests of one run, by (variant, case id, repeat, level); `None` run:
    a new run, where nothing is done."""

    def __init__(self, db: Database | None, run_id: str | None) -> None:
        self._db, self.run_id = db, run_id
        self._n: int | None = None

    def __contains__(self, key: object) -> bool:
        if self._db is None or not isinstance(key, tuple) or len(key) != 4:
            return False
        variant, case_id, repeat, level = key
        return self._db.execute(
            "select 1 from measured where run_id = ? and variant = ? and case_id = ? and repeat = ? "
            "and coalesce(level, 'main') = ? limit 1", [self.run_id, variant, case_id, repeat, level]
        ).fetchone() is not None

    def __len__(self) -> int:
        if self._db is None:
            return 0
        if self._n is None:
            self._n = self._db.execute(
                "select count(*) from (select distinct variant, case_id, repeat, coalesce(level, 'main') from measured "
                "where run_id = ?)", [self.run_id]).fetchone()[0]
        return self._n

    def __bool__(self) -> bool:
        return len(self) > 0

    def count(self, variant: str | None = None, level: str | None = None) -> int:
        """How many are done for a variant (and level), e.g. how many a resumed level skips."""
        if self._db is None:
            return 0
        sql = ("select count(*) from (select distinct variant, case_id, repeat, coalesce(level, 'main') as lv "
               "from measured where run_id = ?"
               + (" and variant = ?" if variant is not None else "") + ")"
               + (" where lv = ?" if level is not None else ""))
        params = [self.run_id] + ([variant] if variant is not None else []) + ([level] if level is not None else [])
        return int(self._db.execute(sql, params).fetchone()[0])

    def of_variant(self, variant: str) -> Iterator[Key]:
        """One variant's keys, streamed (a Ray worker gets its own variant's, not the run's)."""
        if self._db is None:
            return iter(())
        cur = self._db.execute("select distinct variant, case_id, repeat, coalesce(level, 'main') from measured "
                               "where run_id = ? and variant = ?", [self.run_id, variant])
        return (tuple(r) for r in cur)  # type: ignore[misc]


class HeldKeys(set):  # type: ignore[type-arg]
    """Done keys held in memory, where the ledger is not this process's (a Ray worker gets its
    variant's from the driver) or nothing is done yet (a new run)."""

    def count(self, variant: str | None = None, level: str | None = None) -> int:  # type: ignore[override]
        return sum(1 for k in self if (variant is None or k[0] == variant) and (level is None or k[3] == level))

    def of_variant(self, variant: str) -> Iterator[Key]:
        return (k for k in self if k[0] == variant)
