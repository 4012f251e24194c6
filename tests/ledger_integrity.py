"""The suite's last check (issue 45): every SQLite file the tests made passes `PRAGMA
integrity_check` in a separate process, and holds the rows a test said it wrote. A corrupt file
fails the whole suite, naming the test that made it.

Tests register what they know: `not_a_ledger(path)` for a file made deliberately broken (a bad-input
test), `expect_rows(path, table, n)` for the rows a test wrote. Every `*.db` under pytest's base
temporary folder is checked, the ones subprocesses wrote included; the folder a test's `tmp_path`
lies in names the test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DELIBERATE: set[str] = set()
EXPECTED: dict[str, dict[str, int]] = {}
MADE_BY: dict[str, str] = {}  # tmp folder -> the test that asked for it

HEADER = b"SQLite format 3\x00"
# a file evalkit builds beside its final name (evalkit/ledger/files.py `beside`): a kill leaves it
# half-written by design, never under the final name
TEMPORARY = re.compile(r"^\..+-\d+-[0-9a-f]{6}$")

# Run in a fresh interpreter: a file this process holds (locks, a -wal it maps) is read as a
# stranger reads it. Prints one JSON object per file.
CHECKER = r"""
import json, sqlite3, sys
for path, expected in json.loads(sys.stdin.read()):
    out = {"path": path}
    try:
        c = sqlite3.connect(path, timeout=30)
        try:
            rows = [r[0] for r in c.execute("pragma integrity_check")]
            out["integrity"] = "ok" if rows == ["ok"] else "; ".join(rows[:5])
            out["counts"] = {t: c.execute(f"select count(*) from [{t}]").fetchone()[0] for t in expected}
        finally:
            c.close()
    except sqlite3.DatabaseError as e:
        out["integrity"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
"""


def not_a_ledger(path: Path | str) -> Path:
    """A file this test made broken on purpose: the session's check passes over it."""
    DELIBERATE.add(str(Path(path).resolve()))
    return Path(path)


def expect_rows(path: Path | str, table: str, n: int) -> None:
    """The suite's last check will find exactly ``n`` rows in ``table`` of ``path``."""
    EXPECTED.setdefault(str(Path(path).resolve()), {})[table] = n


# An xdist worker's registrations live in its own process; it leaves them here, in its folder, and
# the controller (which checks every worker's folder) reads them all before checking.
REGISTRY = "ledger-integrity.json"


def save(folder: Path) -> None:
    """Leave this process's registrations in ``folder`` for the process that checks it."""
    (folder / REGISTRY).write_text(json.dumps({"deliberate": sorted(DELIBERATE), "expected": EXPECTED,
                                               "made_by": MADE_BY}))


def load(base: Path) -> None:
    """Take in every registration a worker left under ``base``."""
    for f in sorted(base.rglob(REGISTRY)):
        got = json.loads(f.read_text())
        DELIBERATE.update(got["deliberate"])
        for path, tables in got["expected"].items():
            EXPECTED.setdefault(path, {}).update(tables)
        MADE_BY.update(got["made_by"])


def made_by(path: Path, base: Path) -> str:
    """The test that made a file: the one whose tmp folder holds it, else that folder's name."""
    for folder, test in MADE_BY.items():
        if str(path).startswith(folder + "/"):
            return test
    try:
        return path.relative_to(base).parts[0]
    except ValueError:
        return str(path.parent)


def databases(base: Path) -> list[Path]:
    """Every file a test left that SQLite would open as a database (by name or header)."""
    out = []
    for p in sorted(base.rglob("*")):
        if not p.is_file() or str(p.resolve()) in DELIBERATE or p.name.endswith(("-wal", "-shm", "-journal")) \
                or TEMPORARY.match(p.name):
            continue
        if p.suffix in (".db", ".sqlite", ".sqlite3"):
            out.append(p)
            continue
        try:
            with p.open("rb") as f:
                if f.read(16) == HEADER:
                    out.append(p)
        except OSError:
            continue
    return out


def check(base: Path) -> list[str]:
    """One line per file that fails: its path, the test that made it, what was wrong."""
    files = databases(base)
    if not files:
        return []
    todo = [(str(p), EXPECTED.get(str(p.resolve()), {})) for p in files if p.stat().st_size > 0]
    r = subprocess.run([sys.executable, "-c", CHECKER], input=json.dumps(todo), capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != 0:
        return [f"the integrity checker failed: {r.stderr.strip()[-500:]}"]
    bad = []
    for line in r.stdout.splitlines():
        got = json.loads(line)
        p = Path(got["path"])
        where = f"{p} (made by {made_by(p, base)})"
        if got["integrity"] != "ok":
            bad.append(f"{where}: {got['integrity']}")
            continue
        for table, n in EXPECTED.get(str(p.resolve()), {}).items():
            if got["counts"].get(table) != n:
                bad.append(f"{where}: {table} has {got['counts'].get(table)} rows, the test wrote {n}")
    return bad
