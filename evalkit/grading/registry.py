"""The grader registry (how llm and datasette take plugins): evalkit's own graders are registered
by importing them, third-party graders by an entry point in the `evalkit.graders` group, and a
grader in a local module by `module:Class` (a matrix's `graders:`, `--grader module:Class`, with
`--grader-path DIR` for a folder not on the import path). The report, the HTML, Datasette (its view
columns and canned queries), the dataset card, the gate (`check --threshold`), margins and
`graders calibrate` all ask this registry, through each grader's `aggregate` declarations."""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from ..catalogue import Metric
from ..errors import UsageError
from .base import CannedQuery, Grader, GraderContext, Margin, Threshold

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
}
HOW_TO_REGISTER = ("a grader is registered by an entry point in the `evalkit.graders` group of an installed package, "
                   "or named as module:Class (e.g. `graders: [mymodule:ReplyLength]` in the matrix, with "
                   "`--grader-path DIR` when the module is not importable): docs/plugins.md")
_LOCAL: dict[str, str] = {}  # name -> module:Class registered in this process


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


def register(target: str) -> str:
    """Register a grader given as `module:Class` for this process; returns its name."""
    cls = load_class(target)
    known = _targets()
    if cls.name in known and known[cls.name] != target:
        raise UsageError(f"grader '{target}' is named '{cls.name}', which {known[cls.name]} already is")
    _LOCAL[cls.name] = target
    available.cache_clear()
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
    return [reg[n].from_context(ctx) for n in names]


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
            keys = cls.aggregate.headline_keys()
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


def choose(names: list[str] | None, cases: list[Any], *, with_judge: bool = False,
           where: str = "dataset") -> tuple[list[str], list[str]]:
    """The graders a run uses: the ones named (the matrix's `graders:`), else every default one;
    each only when every case carries the fields it reads (`requires`), else skipped with one line.
    A case that carries them badly is a DatasetError naming its line and field."""
    chosen = resolve(names) if names is not None else default_names(with_judge)
    reg = available()  # after resolve: a module:Class it registered is in it
    out, notes = [], []
    for n in chosen:
        cls = reg[n]
        missing = [k for k in cls.requires if not all(c.has(k) for c in cases)]
        if missing:
            lacking = sum(not all(c.has(k) for k in cls.requires) for c in cases)
            notes.append(f"grader '{n}' skipped: {lacking} of {len(cases)} cases lack {', '.join(missing)}, "
                         "which it reads")
            continue
        for c in cases:
            if (why := cls.check_case(c)) is not None:
                from ..errors import DatasetError

                field, _, msg = why.partition(": ")
                raise DatasetError(f"{where}:{c._line}: field '{field}': {msg} (grader '{n}' reads it)")
        out.append(n)
    return out, notes


def specs(names: list[str]) -> list[str]:
    """How a run records its graders: a name, or `module:Class` for one registered from a module."""
    return [_LOCAL.get(n, n) for n in names]


def use_run(run: dict[str, Any]) -> list[str] | None:
    """Make a recorded run's graders available again (its workload folder on the import path, its
    `module:Class` ones registered); returns their names, or None for a run that recorded none."""
    import json

    use_workload(run.get("workload_dir"))
    if not run.get("graders_json"):
        return None
    out = []
    for spec in json.loads(run["graders_json"]):
        try:
            out.append(register(spec) if ":" in spec else spec)
        except UsageError:
            continue  # its module is gone: its grades stay in the ledger, its columns do not show
    return out
