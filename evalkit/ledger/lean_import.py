"""sqlite-utils without pandas, and on the one SQLite library evalkit uses.

sqlite-utils imports pandas when it is installed (`datasets` installs it) only to map
`pandas.Timestamp` to TEXT, which evalkit never inserts; pandas and pyarrow then cost every command
that opens a ledger ~1 s and ~100 MB. And it prefers `pysqlite3` when that is installed, which would
put a second SQLite library in this process: two libraries keep two sets of POSIX locks on one
file, and each believes it is the last connection (sqlite.org/howtocorrupt.html, 2.2.1). Both are
held back while it is imported; imported first by the package, before anything imports
sqlite_utils, and the library it took is checked."""

from __future__ import annotations

import sqlite3
import sys

from ..errors import EvalkitError


def import_sqlite_utils() -> None:
    if "sqlite_utils" not in sys.modules:
        held = {name: sys.modules.get(name) for name in ("pysqlite3", "pysqlite3.dbapi2")}
        lean = "pandas" not in sys.modules
        if lean:
            held["pandas"] = None
        for name in held:
            sys.modules[name] = None  # type: ignore[assignment]  # its `import` raises ImportError
        try:
            import sqlite_utils  # noqa: F401
        finally:
            for name, mod in held.items():
                if mod is None:
                    del sys.modules[name]  # whoever imports it later gets it
                else:
                    sys.modules[name] = mod
    one_sqlite_library()


def one_sqlite_library() -> None:
    """Exactly one SQLite library in this process: the standard library's, which sqlite-utils
    must use too (a sqlite_utils imported before evalkit may have taken pysqlite3)."""
    from sqlite_utils import utils

    if utils.sqlite3 is not sqlite3:
        raise EvalkitError(f"two SQLite libraries in one process: sqlite-utils uses {utils.sqlite3.__name__}, "
                           "evalkit the standard library's sqlite3; import evalkit before sqlite_utils, or uninstall "
                           "pysqlite3")


import_sqlite_utils()
