"""The grader registry (how llm and datasette take plugins): evalkit's own graders are registered
by importing them, third-party graders by an entry point in the `evalkit.graders` group, and a
grader in a local module by `module:Class` (a matrix's `graders:`, `--grader module:Class`, with
`--grader-path DIR` for a folder not on the import path). The report, the HTML, Datasette (its view
columns and canned queries), the dataset card, the gate (`check --threshold`), margins and
`graders calibrate` all ask this registry, through each grader's `aggregate` declarations."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from ..catalogue import Metric
from ..errors import UsageError
from .base import CannedQuery, Grader, GraderContext, Margin, Threshold, hook

ENTRY_POINT_GROUP = "evalkit.graders"
OWN_DIST = "evalkit"
# evalkit's own graders: registered by import, so a checkout on PYTHONPATH has them too
BUILTINS = {
    "schema": "evalkit.grading.schema:SchemaGrader",
    "persona": "evalkit.grading.persona:PersonaGrader",
    "formality": "evalkit.grading.formality:FormalityGrader",
    "drift": "evalkit.grading.drift:DriftGrader",
    "judge": "evalkit.grading.judge:JudgeGrader",
    "load_drift": "evalkit.grading.load_drift:LoadDriftGrader",
    "divergence": "evalkit.grading.divergence:DivergenceGrader",
    "accuracy": "evalkit.grading.accuracy:AccuracyGrader",
}
HOW_TO_REGISTER = ("a grader is registered by an entry point in the `evalkit.graders` group of an installed package, "
                   "or named as module:Class (e.g. `graders: [mymodule:ReplyLength]` in the matrix, with "
                   "`--grader-path DIR` when the module is not importable): docs/plugins.md")
_LOCAL: dict[str, str] = {}  # name -> module:Class registered in this process
_ROOTS: dict[str, str] = {}  # name -> the folder its module was imported from (recorded with a run)
_ORIGIN: dict[str, str] = {}  # name -> where this process found it (a run, a workload, --grader-path)


def load_class(target: str, name: str | None = None) -> type[Grader]:
    """The Grader class behind `module:Class`; a broken plugin names itself, it never takes
    evalkit down."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"grader '{target}': expected module:Class")
    try:
        cls = getattr(import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - any import error of a plugin becomes one line
        raise UsageError(f"grader plugin '{name or target}' ({target}) failed to load: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Grader)):
        raise UsageError(f"grader plugin '{name or target}' ({target}) is not an evalkit.grading.Grader subclass")
    if name is not None and getattr(cls, "name", None) != name:
        raise UsageError(f"grader plugin '{name}' ({target}) declares name '{getattr(cls, 'name', None)}'")
    if not getattr(cls, "name", None) or not getattr(cls, "version", None):
        raise UsageError(f"grader plugin '{target}' declares no `name` or `version`")
    return cls


def add_path(path: str | Path) -> None:
    """`--grader-path DIR`: modules in DIR can be named as graders."""
    p = str(Path(path).resolve())
    if not Path(p).is_dir():
        raise UsageError(f"--grader-path: {path} is not a folder")
    if p not in sys.path:
        sys.path.insert(0, p)


def _import_root(cls: type) -> str | None:
    """The folder a module:Class was imported from (what goes on the import path to import it
    again from any directory), or None for a module without a file."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = cls.__module__.count(".") + (Path(file).name == "__init__.py")
    return str(Path(file).resolve().parents[depth])


def register(target: str, origin: str | None = None) -> str:
    """Register a grader given as `module:Class` for this process; returns its name."""
    cls = load_class(target)
    known = _targets()
    if cls.name in known and known[cls.name] != target:
        raise UsageError(f"grader '{target}' is named '{cls.name}', which {known[cls.name]} already is")
    if cls.name not in _LOCAL:
        available.cache_clear()
    _LOCAL[cls.name] = target
    if (root := _import_root(cls)) is not None:
        _ROOTS[cls.name] = root
    if origin:
        _ORIGIN.setdefault(cls.name, origin)
    return cls.name


def _targets() -> dict[str, str]:
    """name -> module:Class: the built-ins, then installed plugins, then local ones."""
    out = dict(BUILTINS)
    others = sorted((e for e in entry_points(group=ENTRY_POINT_GROUP)
                     if e.dist is None or e.dist.name != OWN_DIST), key=lambda e: e.name)
    for ep in others:
        out.setdefault(ep.name, ep.value)
    for name, target in _LOCAL.items():
        out.setdefault(name, target)
    return out


@lru_cache(maxsize=1)
def available() -> dict[str, type[Grader]]:
    """name -> grader class: evalkit's own, then plugins, each by name."""
    return {name: load_class(t, name) for name, t in _targets().items()}


def resolve(names: list[str]) -> list[str]:
    """Grader names from a matrix or the command line: a known name, or `module:Class` (registered
    here); an unknown one is a usage error that says how to register it."""
    out = []
    for n in names:
        n = n.strip()
        if ":" in n:
            out.append(register(n))
            continue
        if n not in available():
            raise UsageError(f"unknown grader '{n}' (known: {', '.join(available())}); {HOW_TO_REGISTER}")
        out.append(n)
    return out


def default_names(with_judge: bool = False) -> list[str]:
    return [n for n, c in available().items() if c.default or (with_judge and n == "judge")]


def make_graders(names: list[str] | None = None, ctx: GraderContext | None = None) -> list[Grader]:
    names = resolve(list(names)) if names is not None else default_names()
    reg = available()  # after resolve: a module:Class it registered is in it
    ctx = ctx or GraderContext()
    if ctx.embed is None:
        from .embeddings import embed  # lazy: only graders that embed load the model

        ctx.embed = embed
    return [hook(reg[n], "from_context", ctx) for n in names]


def aggregate_hook(agg: type[Any], name: str, *args: Any) -> Any:
    """`hook` for code that holds only an aggregate: its grader is the registered one that points at it."""
    grader = next((cls for cls in available().values() if cls.aggregate is agg), None)
    if grader is None:  # not a registered grader's (a test's own): called as written
        return getattr(agg, name)(*args)
    return hook(grader, name, *args)


def view_columns() -> list[tuple[str, str, str]]:
    """(column, grader, field) for Datasette's `requests_joined` view."""
    return [(col, name, fld) for name, cls in available().items() for col, fld in cls.aggregate.view_columns]


def summary_columns(graders: list[str] | None = None) -> list[Metric]:
    return [c for name, cls in available().items() if graders is None or name in graders
            for c in cls.aggregate.columns]


def headline_columns(graders: list[str] | None = None) -> list[Metric]:
    """Each grader's headline summary columns: what the study summary, the card and Datasette's
    summary query show per variant."""
    out = []
    for name, cls in available().items():
        if graders is None or name in graders:
            keys = hook(cls, "headline_keys")
            out += [c for c in cls.aggregate.columns if c.key in keys]
    return out


def thresholds() -> dict[str, tuple[str, Threshold]]:
    """threshold name -> (grader, Threshold), for `evalkit check --threshold NAME=VALUE`."""
    return {t.name: (name, t) for name, cls in available().items() for t in cls.aggregate.thresholds}


def margins() -> dict[str, tuple[str, Margin]]:
    """margin name -> (grader, Margin), for non-inferiority verdicts."""
    return {m.name: (name, m) for name, cls in available().items() for m in cls.aggregate.margins}


def canned_queries() -> list[tuple[str, CannedQuery]]:
    return [(name, q) for name, cls in available().items() for q in cls.aggregate.canned_queries]


def calibratable() -> list[str]:
    return [name for name, cls in available().items() if cls.calibration_file]


def use_workload(folder: str | Path | None) -> None:
    """A run's workload folder: its `module:Class` graders import from there."""
    if folder and Path(folder).is_dir():
        add_path(folder)


ROWS_NAMED = 5  # rows a note names before it counts the rest
BAD_ROWS_NAMED = 20  # rows a refusal names before it counts the rest: every one, up to a screenful


def rows_lacking(cases: Iterable[Any], fields: tuple[str, ...], where: str) -> str:
    """`data.jsonl:2 (persona), data.jsonl:7 (persona, task) and 3 more`: the rows that lack fields."""
    named, more = [], 0
    for c in cases:
        if ks := [k for k in fields if not c.has(k)]:
            if len(named) < ROWS_NAMED:
                named.append(f"{where}:{c._line or '?'} ({', '.join(ks)})")
            else:
                more += 1
    return ", ".join(named) + (f" and {more} more" if more else "")


def can_grade(cls: type[Grader], case: Any) -> bool:
    """Whether a case carries every field the grader reads (`requires`)."""
    return all(case.has(k) for k in cls.requires)


def choose(names: list[str] | None, cases: Sequence[Any], *, with_judge: bool = False,
           where: str = "dataset", also: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """The graders a run uses: the ones named (the matrix's `graders:` or --grader), else every
    default one. A default grader grades the cases that carry the fields it reads (`requires`),
    the rows that lack them named by file:line (none carries them: skipped, one line); a grader
    named explicitly whose rows lack its fields is a DatasetError naming them. A case that carries
    the fields badly is a DatasetError naming its line and field."""
    from ..errors import DatasetError

    chosen = resolve(names) if names is not None else default_names(with_judge)
    chosen = [*chosen, *(a for a in also if a not in chosen)]  # ``also``: graded where their fields are, as a default
    reg = available()  # after resolve: a module:Class it registered is in it
    out, notes = [], []
    bad: dict[str, str] = {}  # `file:line: field 'f': problem` -> the first grader that reads it: every bad row
    for n in chosen:
        cls = reg[n]
        # passes that count, not lists: a trace's cases are read back from disk (`spec.spool`)
        have = sum(1 for c in cases if can_grade(cls, c))
        if have < len(cases):
            rows = rows_lacking(cases, cls.requires, where)
            missing = ", ".join(k for k in cls.requires if not all(c.has(k) for c in cases))
            if names is not None and n not in also:
                raise DatasetError(f"grader '{n}' is named explicitly but {len(cases) - have} of {len(cases)} "
                                   f"rows lack {missing}, which it reads: {rows}; add the field to them, or drop "
                                   "the grader")
            if not have:
                notes.append(f"grader '{n}' skipped: {len(cases)} of {len(cases)} cases lack {missing}, which it reads")
                continue
            notes.append(f"grader '{n}' grades {have} of {len(cases)} cases: the others lack {missing}, which it "
                         f"reads: {rows}")
        for c in cases:
            at = f"{where}:{c._line or '?'}"
            if can_grade(cls, c) and (why := hook(cls, "check_case", c, where=f" (on {at})")) is not None:
                field, _, msg = why.partition(": ")
                bad.setdefault(f"{at}: field '{field}': {msg}", n)
        out.append(n)
    if bad:
        raise DatasetError(bad_rows_text(bad))
    return out, notes


def bad_rows_text(bad: dict[str, str]) -> str:
    """Every row a grader cannot read, each as file:line (the first `BAD_ROWS_NAMED`, then `+N
    more`), grouped by grader: one line."""
    shown, parts = [(g, r) for r, g in bad.items()][:BAD_ROWS_NAMED], []
    for n in dict.fromkeys(g for g, _ in shown):
        rows = [r for g, r in shown if g == n]
        parts.append("; ".join(rows) + f" (grader '{n}' reads {'it' if len(rows) == 1 else 'them'})")
    more = f"; +{len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
    return "; ".join(parts) + more


def specs(names: list[str]) -> list[str | dict[str, str]]:
    """How a run records its graders: a name, or for one registered from a module its `module:Class`
    and the folder it was imported from, so any later command finds it from any directory."""
    out: list[str | dict[str, str]] = []
    for n in names:
        if n in _LOCAL and n in _ROOTS:
            out.append({"target": _LOCAL[n], "path": _ROOTS[n]})
        else:
            out.append(_LOCAL.get(n, n))
    return out


UNRESOLVED: dict[str, str] = {}  # a recorded module:Class that could not be imported again -> why


def use_run(run: dict[str, Any]) -> list[str] | None:
    """Make a recorded run's graders available again (its workload folder and each module's own
    folder on the import path, its `module:Class` ones registered); returns their names, or None
    for a run that recorded none. One that cannot be imported any more is kept in `UNRESOLVED`."""
    import json

    use_workload(run.get("workload_dir"))
    if not run.get("graders_json"):
        return None
    out = []
    for spec in json.loads(run["graders_json"]):
        target = spec["target"] if isinstance(spec, dict) else spec
        if isinstance(spec, dict):
            use_workload(spec.get("path"))
        try:
            out.append(register(target, f"run {run.get('id')}") if ":" in target else target)
        except UsageError as e:
            UNRESOLVED[target] = str(e)  # its grades stay in the ledger; its columns show once it is found
    return out


def use_ledger(ledger: Any, run_id: str | None = None) -> list[str]:
    """Every run's graders (or one run's) made available: what `browse`, `graders list` and the
    commands that read a run call first. Returns the names found."""
    ids = [run_id] if run_id else ledger.run_ids()
    out: list[str] = []
    for rid in ids:
        out += use_run(ledger.require_run(rid)) or []
    return list(dict.fromkeys(out))


def use_paths(paths: Any) -> list[str]:
    """`--grader-path DIR` (repeatable): modules in each folder can be named as graders, and the
    graders they define are registered by name. Returns their names."""
    out: list[str] = []
    for p in paths or ():
        add_path(p)
        out += discover(p)
    return out


def workload_here() -> Path | None:
    """The current folder when it is a workload folder (it holds a matrix.yaml)."""
    return Path.cwd() if (Path.cwd() / "matrix.yaml").is_file() else None


def use(ledger: Any = None, run_id: str | None = None, paths: Any = (), every_run: bool = False,
        workload: str | Path | None = None) -> list[str] | None:
    """The one grader resolution every command makes before it names a grader, a metric, a margin
    or a threshold: built-ins and entry points (always), the modules of each `--grader-path` and of
    ``workload`` (a workload folder, e.g. `workload_here()`), and the graders the run recorded (its
    workload folder, each `module:Class` with its folder); with ``every_run`` those of every run in
    the ledger (browse). Returns the run's recorded names."""
    use_paths(paths)
    if workload is not None:
        discover(workload)
    if ledger is None:
        return None
    if every_run:
        use_ledger(ledger)
        return None
    return use_run(ledger.require_run(run_id))


def record(ledger: Any, run_id: str, names: list[str]) -> None:
    """Add the `module:Class` graders among ``names`` to what a run recorded (`evalkit grade
    --grader mod:Class` on it), so every later command finds them again from any directory
    (built-ins and entry points are always found)."""
    import json

    run = ledger.require_run(run_id)
    have = json.loads(run["graders_json"]) if run.get("graders_json") else list(default_names())
    known = {x["target"] if isinstance(x, dict) else x for x in have}
    new = [s for s in specs([n for n in names if n in _LOCAL])
           if (s["target"] if isinstance(s, dict) else s) not in known]
    if new:
        ledger.update_run(run_id, {"graders_json": json.dumps(have + new)})


def discover(folder: str | Path) -> list[str]:
    """Every Grader subclass defined in a top-level module of ``folder`` (a workload folder,
    `--grader-path DIR`), registered: how `graders list` shows graders no run has used yet. Only
    modules whose source names `Grader` are imported."""
    import inspect

    root = Path(folder).resolve()
    add_path(root)
    out = []
    for py in sorted(root.glob("*.py")):
        try:
            if "Grader" not in py.read_text(encoding="utf-8", errors="replace"):
                continue
            module = import_module(py.stem)
        except Exception as e:  # noqa: BLE001 - a broken module names itself, the others still list
            UNRESOLVED[f"{py.stem} ({py})"] = f"failed to load: {e}"
            continue
        for attr, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Grader) and cls is not Grader and cls.__module__ == module.__name__ \
                    and getattr(cls, "name", None) and getattr(cls, "version", None):
                try:
                    out.append(register(f"{module.__name__}:{attr}", str(root)))
                except UsageError as e:
                    UNRESOLVED[f"{module.__name__}:{attr}"] = str(e)
    return out


def origin(name: str) -> str:
    """Where a registered grader comes from: built in, an installed package, or a module found here."""
    if name in BUILTINS:
        return "built in"
    if name in _LOCAL:
        where = _ROOTS.get(name) or _ORIGIN.get(name)
        return _LOCAL[name] + (f" from {where}" if where else "")
    return f"entry point {_targets().get(name)}"


# what a run sends only for one grader: its name -> why, and how to turn it off in a matrix
ONLY_FOR = {"drift": "the baseline's second pass (drift's noise floor)",
            "divergence": "teacher-forced scoring of the baseline's answers on every server"}


def serve_only(matrix: Any, graders: list[str]) -> list[str]:
    """Only what the chosen graders read is sent: without drift the baseline goes once (no noise-floor
    pass), without divergence no teacher-forced scoring. Changes ``matrix`` (which the run then
    records); returns one line per thing left out."""
    out = []
    gen = matrix.generation
    if "drift" not in graders and gen.baseline_repeats > 1:
        gen.baseline_repeats = 1
        out.append(f"not sent: {ONLY_FOR['drift']}: drift is not among the graders ({', '.join(graders) or 'none'})")
    div = getattr(matrix, "divergence", None)
    if "divergence" not in graders and div is not None and div.enabled:
        div.enabled = False
        out.append(f"not sent: {ONLY_FOR['divergence']}: divergence is not among the graders")
    return out
