"""The shape of the code, checked: one owner for SQL, imports that run one way, no cycles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from evalkit.paths import PACKAGE_DIR

SQL = re.compile(r"^\s*(select\b.+\bfrom\b|insert\s+into\b|update\s+\w+\s+set\b|delete\s+from\b|"
                 r"create\s+(table|view|index)\b|drop\s+(table|view)\b|pragma\b)", re.IGNORECASE | re.DOTALL)

# Layers by package, lowest first: a module may import its own layer and lower ones, never a
# higher one. The root holds only what everything shares.
LAYERS = [
    {"__init__", "errors", "paths", "stats", "redact", "host", "catalogue"},
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
                if any(n.split(".")[0] in ("sqlite3", "sqlite_utils") for n in names):
                    offenders.append(f"{mod}:{node.lineno} imports {names}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("query", "execute", "executescript"):
                offenders.append(f"{mod}:{node.lineno} calls .{node.func.attr}()")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
                offenders.append(f"{mod}:{node.lineno} holds SQL: {node.value[:40]!r}")
    assert not offenders, "\n".join(offenders)


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
