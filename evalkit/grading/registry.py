"""The grader registry: every grader is a class behind an entry point in the `evalkit.graders`
group (how llm and datasette take plugins). Adding a grader is one file plus one entry point:
the report, the HTML, Datasette (its view columns and canned queries), the dataset card, the
gate (`check --threshold`), margins and `graders calibrate` all ask this registry."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import entry_points

from ..errors import UsageError
from .base import CannedQuery, Grader, GraderContext, Margin, SummaryColumn, Threshold

ENTRY_POINT_GROUP = "evalkit.graders"
OWN_DIST = "evalkit"


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
    """name -> grader class: evalkit's own, then plugins, each by name. The
    built-ins come through exactly the plugin path: their entry points."""
    eps = list(entry_points(group=ENTRY_POINT_GROUP))
    own = [e for e in eps if e.dist is not None and e.dist.name == OWN_DIST]
    others = sorted((e for e in eps if e not in own), key=lambda e: e.name)
    targets: dict[str, str] = {}
    for ep in own + others:
        targets.setdefault(ep.name, ep.value)
    if not targets:
        raise UsageError(f"no graders are registered (entry point group {ENTRY_POINT_GROUP}): install evalkit "
                         "with `pip install -e .` so its own graders are registered")
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


def headline_columns(graders: list[str] | None = None) -> list[SummaryColumn]:
    """Each grader's headline summary columns: what the study summary, the card and Datasette's
    summary query show per variant."""
    out = []
    for name, cls in available().items():
        if graders is None or name in graders:
            keys = cls.headline_keys()
            out += [c for c in cls.summary_columns if c.key in keys]
    return out


def thresholds() -> dict[str, tuple[str, Threshold]]:
    """threshold name -> (grader, Threshold), for `evalkit check --threshold NAME=VALUE`."""
    return {t.name: (name, t) for name, cls in available().items() for t in cls.thresholds}


def margins() -> dict[str, tuple[str, Margin]]:
    """margin name -> (grader, Margin), for non-inferiority verdicts."""
    return {m.name: (name, m) for name, cls in available().items() for m in cls.margins}


def canned_queries() -> list[tuple[str, CannedQuery]]:
    return [(name, q) for name, cls in available().items() for q in cls.canned_queries]


def calibratable() -> list[str]:
    return [name for name, cls in available().items() if cls.calibration_file]
