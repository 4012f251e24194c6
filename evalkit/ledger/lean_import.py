"""sqlite-utils without pandas. sqlite-utils imports pandas when it is installed (`datasets`
installs it) only to map `pandas.Timestamp` to TEXT, which evalkit never inserts; pandas and
pyarrow then cost every command that opens a ledger ~1 s and ~100 MB. Imported first by the
package, before anything imports sqlite_utils."""

from __future__ import annotations

import sys


def import_sqlite_utils() -> None:
    if "sqlite_utils" in sys.modules or "pandas" in sys.modules:
        return  # too late, or pandas is loaded anyway: nothing to save
    sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError
    try:
        import sqlite_utils  # noqa: F401
    finally:
        del sys.modules["pandas"]  # whoever imports pandas later gets it


import_sqlite_utils()
