"""The grader registry: every grader is a class behind an entry point in the `evalkit.graders`
group (how llm and datasette take plugins). Adding a grader is one file plus one entry point:
report, HTML, Datasette's `requests_joined` view and the dataset card pick it up from here."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import entry_points

from ..errors import UsageError
from .base import Grader, GraderContext, SummaryColumn

ENTRY_POINT_GROUP = "evalkit.graders"

# evalkit's own graders, also declared as entry points in pyproject.toml; listed here so that a
# source checkout that was never pip-installed still has them.
BUILTIN = {
    "schema": "evalkit.grading.schema:SchemaGrader",
    "persona": "evalkit.grading.persona:PersonaGrader",
    "formality": "evalkit.grading.formality:FormalityGrader",
    "drift": "evalkit.grading.drift:DriftGrader",
    "judge": "evalkit.grading.judge:JudgeGrader",
}


def _load(name: str, target: str) -> type[Grader]:
    from importlib import import_module

    module, _, attr = target.partition(":")
    try:
        cls = getattr(import_module(module), attr)
    except Exception as e:  # a broken plugin names itself, it does not take evalkit down
        raise UsageError(f"grader plugin '{name}' ({target}) failed to load: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Grader)):
        raise UsageError(f"grader plugin '{name}' ({target}) is not an evalkit.grading.Grader subclass")
    if getattr(cls, "name", None) != name:
        raise UsageError(f"grader plugin '{name}' ({target}) declares name '{getattr(cls, 'name', None)}'")
    return cls


@lru_cache(maxsize=1)
def available() -> dict[str, type[Grader]]:
    """name -> grader class, built-ins first, then plugins in name order."""
    targets = dict(BUILTIN)
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        targets.setdefault(ep.name, ep.value)
    return {name: _load(name, t) for name, t in targets.items()}


def default_names(with_judge: bool = False) -> list[str]:
    return [n for n, c in available().items() if c.default or (with_judge and n == "judge")]


def make_graders(names: list[str] | None = None, ctx: GraderContext | None = None) -> list[Grader]:
    reg = available()
    names = list(names or default_names())
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise UsageError(f"unknown grader(s): {', '.join(unknown)} (known: {', '.join(reg)})")
    ctx = ctx or GraderContext()
    if ctx.embed is None:
        from .embeddings import embed  # lazy: only graders that embed load the model

        ctx.embed = embed
    return [reg[n].from_context(ctx) for n in names]


def view_columns() -> list[tuple[str, str, str]]:
    """(column, grader, field) for Datasette's `requests_joined` view."""
    return [(col, name, fld) for name, cls in available().items() for col, fld in cls.view_columns]


def summary_columns(graders: list[str] | None = None) -> list[SummaryColumn]:
    return [c for name, cls in available().items() if graders is None or name in graders
            for c in cls.summary_columns]
