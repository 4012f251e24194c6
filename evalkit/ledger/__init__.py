"""The ledger: the only code in evalkit that talks to SQLite. Numbered migrations applied in one
`open_ledger()`, a `Ledger` with every read and write the rest of evalkit needs (its connection
is private), canned queries for Datasette, merging ledgers, and the mirrored ledger a Ray worker
writes through.

May import: the root modules only (errors). Everything else imports it.
"""

from . import lean_import  # noqa: F401  (first: sqlite_utils without pandas)
from .done import DoneKeys, HeldKeys
from .files import copy_ledger
from .migrations import MIGRATION_NAMES, MIGRATION_SET, migrations
from .opening import open_ledger, open_ledgers
from .store import CASE_FIELDS, Ledger, RunRecord, dumps, utcnow

__all__ = ["CASE_FIELDS", "DoneKeys", "HeldKeys",
           "MIGRATION_NAMES", "MIGRATION_SET", "Ledger", "RunRecord", "copy_ledger", "dumps", "migrations", "open_ledger",
           "open_ledgers",
           "utcnow"]
