"""The ledger package: the only code in evalkit that talks to SQLite."""

from .migrations import MIGRATION_NAMES, MIGRATION_SET, migrations
from .store import CASE_FIELDS, Ledger, dumps, open_ledger, utcnow

__all__ = ["CASE_FIELDS", "MIGRATION_NAMES", "MIGRATION_SET", "Ledger", "dumps", "migrations", "open_ledger", "utcnow"]
