"""The shape of the code, checked: one owner for SQL, imports that run one way, no cycles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from evalkit.paths import PACKAGE_DIR

SQL = re.compile(r"^\s*(select\b.+\bfrom\b|insert\s+into\b|update\s+\w+\s+set\b|delete\s+from\b|"
                 r"create\s+(table|view|index)\b|drop\s+(table|view)\b|pragma\b)", re.IGNORECASE | re.DOTALL)

# Layers by package, lowest first: a module may import its own layer and lower ones, never a
# higher one. The root holds only what everything shares.
LAYERS = [
    {"__init__", "errors", "paths", "stats", "redact", "host", "catalogue", "spawn"},
    {"spec", "suites"},
    {"ledger"},
    {"engines", "measure", "testing"},
    {"grading"},
    {"execution"},
    {"reporting"},
    {"sharing"},
    {"cli"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# Graders read the ledger; they never reach into how requests were sent or measured.
FORBIDDEN = {("grading", "measure"), ("grading", "engines")}
MAX_LINES = 450


def modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE_DIR.rglob("*.py"):
        parts = p.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def top(mod: str) -> str:
    """evalkit.grading.persona -> grading; evalkit.cli -> cli; evalkit -> __init__."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(mod: str, path: Path) -> set[str]:
    """Every evalkit module this one imports, lazy (in-function) imports included."""
    out: set[str] = set()
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if target.startswith("evalkit"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("evalkit"))
    known = modules()
    return {m for m in out if m in known}


def test_only_the_ledger_package_talks_to_sqlite():
    offenders = []
    for mod, path in modules().items():
        if mod.startswith("evalkit.ledger"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] in ("sqlite3", "sqlite_utils", "duckdb") for n in names):
                    offenders.append(f"{mod}:{node.lineno} imports {names}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("query", "execute", "executescript"):
                offenders.append(f"{mod}:{node.lineno} calls .{node.func.attr}()")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
                offenders.append(f"{mod}:{node.lineno} holds SQL: {node.value[:40]!r}")
    assert not offenders, "\n".join(offenders)


def test_duckdb_opens_a_ledger_only_in_the_query_worker():
    # two copies of SQLite in one process must never open one file: DuckDB's runs in its own process
    offenders = [f"{mod}:{node.lineno}" for mod, path in modules().items() if mod != "evalkit.ledger.duck_worker"
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Duck"]
    assert not offenders, "Duck( outside evalkit/ledger/duck_worker.py: " + ", ".join(offenders)


def test_imports_run_one_way():
    wrong = []
    for mod, path in modules().items():
        src = top(mod)
        assert src in RANK, f"{mod}: put '{src}' in a layer of this test"
        for dep in imports(mod, path):
            dst = top(dep)
            if RANK[dst] > RANK[src] or (src, dst) in FORBIDDEN:
                wrong.append(f"{mod} -> {dep}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules():
    graph = {mod: imports(mod, path) - {mod} for mod, path in modules().items()}
    # a package's __init__ re-exporting its own modules is not a cycle of concerns
    for mod in graph:
        graph[mod] = {d for d in graph[mod] if not (mod.startswith(d + ".") and modules()[d].name == "__init__.py")}
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if seen.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in seen:
                visit(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m)


def test_no_database_handle_outside_the_ledger_package():
    """`.db[...]`, `.db.x` or `._db` anywhere but evalkit/ledger/: the ledger's connection is
    private, so every read and write goes through a Ledger method."""
    offenders = []
    for mod, path in modules().items():
        if mod.startswith("evalkit.ledger"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("db", "_db"):
                offenders.append(f"{mod}:{node.lineno} uses .{node.attr}")
    assert not offenders, "\n".join(offenders)


def test_the_root_holds_only_shared_modules_and_no_module_is_too_long():
    root = {p.stem for p in PACKAGE_DIR.glob("*.py")}
    assert root <= LAYERS[0] | {"cli"}, f"put these in a package by concern: {sorted(root - LAYERS[0])}"
    long = {m: n for m, p in modules().items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by concern): {long}"


def test_every_package_says_what_it_owns_and_may_import():
    for init in PACKAGE_DIR.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert len(doc) > 80, f"{init}: a docstring saying what it owns and may import"
        assert "import" in doc, f"{init}: a docstring saying what it owns and may import"


# --- the ledger is sacred (issue 45) -----------------------------------------------------------------
TREES = ("evalkit", "tests", "benchmarks")
BYTE_COPIES = {"copy", "copy2", "copyfile", "copyfileobj", "move", "copytree"}
# copytree of folders that hold source code only (checked below to hold no database)
SOURCE_TREES = {"tests/test_grader_plugin.py": "tests/plugins", "tests/test_parity.py": "examples/support",
                "tests/test_matrix.py": "examples/support", "tests/test_outputs_agree.py": "examples/support"}


def _python_files() -> list[Path]:
    root = PACKAGE_DIR.parent
    return [p for t in TREES for p in sorted((root / t).rglob("*.py"))]


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Call)]


def test_no_byte_copy_of_a_database_anywhere():
    """A ledger is copied only through SQLite's backup API (`evalkit.ledger.copy_ledger`): closing a
    byte copy's file descriptor drops this process's POSIX locks on the original, and another
    process then checkpoints and unlinks a -wal that live connections still use."""
    root, offenders = PACKAGE_DIR.parent, []
    for path in _python_files():
        rel = str(path.relative_to(root))
        for call in _calls(path):
            f = call.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if owner == "shutil" and name in BYTE_COPIES and not (name == "copytree" and rel in SOURCE_TREES):
                offenders.append(f"{rel}:{call.lineno} shutil.{name}")
            elif name == "write_bytes" and any(isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute)
                                               and a.func.attr == "read_bytes" for a in ast.walk(call)):
                offenders.append(f"{rel}:{call.lineno} write_bytes(read_bytes())")
    assert not offenders, "copy ledgers with evalkit.ledger.copy_ledger:\n" + "\n".join(offenders)


@pytest.mark.parametrize("folder", sorted(set(SOURCE_TREES.values())))
def test_the_source_trees_tests_copy_hold_no_database(folder):
    assert not [p for p in (PACKAGE_DIR.parent / folder).rglob("*") if p.suffix in (".db", ".sqlite")]


def test_no_python_runs_between_fork_and_exec():
    """`preexec_fn` runs Python in the forked child while the parent holds connections and threads:
    a child sets its parent-death signal in its own code after exec (evalkit/spawn.py)."""
    root = PACKAGE_DIR.parent
    offenders = [f"{p.relative_to(root)}:{c.lineno}" for p in _python_files() for c in _calls(p)
                 if any(k.arg == "preexec_fn" for k in c.keywords)]
    assert not offenders, "\n".join(offenders)


def test_sqlite_utils_uses_the_one_sqlite_library_evalkit_uses():
    import sqlite3

    from sqlite_utils import utils

    assert utils.sqlite3 is sqlite3


def test_no_ledger_mixin_shadows_another_s_method():
    """The `Ledger` is assembled from mixins, one per concern: a method named like another mixin's
    would silently lose to whichever comes first."""
    from evalkit.ledger.store import Ledger

    owners: dict[str, list[str]] = {}
    for cls in Ledger.__mro__:
        for name, value in vars(cls).items():
            if callable(value) and not name.startswith("__"):
                owners.setdefault(name, []).append(cls.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
