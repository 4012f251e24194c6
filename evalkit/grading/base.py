"""What a grader is (after inspect_ai's scorers and llm's plugin hooks): a `Grader` class that
scores outputs (a value, pass/fail, an explanation and raw detail per request), and beside it an
`Aggregate` that declares what its grades become: report columns, gates, margins, Datasette
views and queries, plots. docs/plugins.md documents every hook; a test keeps it so."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ValidationError

from ..catalogue import CaseValue, Metric
from ..errors import EvalkitError, PluginError
from ..spec.dataset import Case
from ..stats import mean

Kind = Literal["request", "pair", "run"]


@dataclass
class Score:
    value: float
    passed: bool | None
    explanation: str
    detail: dict[str, Any] = field(default_factory=dict)


def _doc(text: str, **kw: Any) -> Any:
    """A field with its meaning (docs/plugins.md is generated from these: `grading/inputs_doc.py`)."""
    return field(metadata={"doc": text}, **kw)


@dataclass
class GradedRequest:
    """What a grader sees of one ledger row."""

    request_id: int = _doc("the request's row id in the ledger (`requests.id`)")
    variant: str = _doc("the variant that answered")
    text: str = _doc("the answer, as streamed (\"\" when it was empty)")
    finish_reason: str | None = _doc("why generation stopped: stop, length, ...")
    case: Case = _doc("the case it answered, with everything its dataset row carried (below)")
    level: str = _doc("the load level it was sent at (a sweep's c=N), so pairs compare like with like",
                      default="main")
    concurrency: int = _doc("the concurrency of that level", default=1)
    repeat: int = _doc("which repeat of the case (0 first; the baseline's noise-floor pass after the run's)",
                       default=0)
    reasoning: str = _doc("a reasoning model's thinking, streamed apart from the answer (\"\" when none): "
                          "`text` is the answer alone; a judge may read both", default="")


@dataclass(frozen=True)
class Threshold:
    """A gate a grader offers to `evalkit check --threshold NAME=VALUE`: the summary value ``key``
    (on each variant's "all" slice) divided by ``scale`` must be at least (``min``) or at most
    (``max``) the limit. With ``ci_key``, a "max" check fails only when the whole interval lies
    above the limit (a difference the data shows, not one chance may have made)."""

    name: str
    key: str
    direction: Literal["min", "max"]
    description: str
    scale: float = 1.0
    ci_key: str | None = None
    candidates_only: bool = False  # a comparison with the baseline (drift): not for the baseline itself


@dataclass(frozen=True)
class Margin:
    """A paired, per-case metric a grader offers to non-inferiority margins (`margins:` in a matrix,
    `evalkit check --margins`): the candidate's value minus the baseline's on the same case, with
    its unit ("pp": percentage points of a pass rate; "abs": the metric's own unit) and which way is
    better. ``Aggregate.margin_values`` supplies each side's per-case values. ``min_pairs``: the
    fewest pairs from which a verdict on it is read (its per-case shape: below it the tests err
    more than they promise whatever the data, docs/verdicts.md); fewer read inconclusive.
    ``one_sided``: the baseline's side is the best any variant can read (a floor that a variant
    identical to the baseline reaches), so the margin is its only hypothesis and no verdict says
    "superior": an interval below 0 reads as no difference, non-inferior. ``qualified``: the margin
    may name a part, `NAME:QUALIFIER` (`accuracy:gsm8k=-2pp`), whose per-case values
    ``Aggregate.margin_values`` gives under that key too."""

    name: str
    unit: Literal["pp", "abs"]
    higher_is_better: bool
    description: str
    min_pairs: int = 0
    one_sided: bool = False
    qualified: bool = False  # also NAME:QUALIFIER (accuracy:gsm8k): `margin_values` keys those values so too


@dataclass(frozen=True)
class CannedQuery:
    """A Datasette query a grader wants, as a shape the ledger package turns into SQL (so no SQL
    lives outside it): ``failures`` lists outputs whose newest grade failed; ``lowest`` /
    ``highest`` order by the grader's view ``column``."""

    name: str
    title: str
    kind: Literal["failures", "lowest", "highest"]
    column: str | None = None


@dataclass
class GraderContext:
    """What a grader may need from the run: the matrix's judge section, the embedding function, the
    run's teacher-forced token scores."""

    judge: Any = None
    embed: Callable[[list[str]], Any] | None = None
    quality_under_load: bool = False  # the run's matrix asked to compare outputs across load levels
    rubrics: Path | None = None  # the workload's rubrics folder: a file there replaces the shipped one

    def rubric(self, name: str) -> Path:
        """A rubric file: the workload's when it has one, else the shipped one."""
        from ..paths import rubric_file

        return rubric_file(self.rubrics, name)
    # the run's teacher-forced token scores (ledger `token_scores`), set by `grade_run` for the run it grades
    token_scores: Callable[[], list[dict[str, Any]]] | None = None


class Aggregate:
    """What a grader declares beside its scoring: how its grades are summarised per slice
    (``columns``, ``summarise``), which summary a study table leads with (``headline``), how a run
    is gated on it (``thresholds``), compared with the baseline (``margins``, ``margin_values``),
    browsed (``view_columns``, ``canned_queries``), plotted (``scatter``) and explained (``notes``).
    Nothing here grades: a grader points at its declarations with ``Grader.aggregate``."""

    columns: ClassVar[tuple[Metric, ...]] = ()  # report columns; the first is the headline unless `headline`
    headline: ClassVar[tuple[str, ...]] = ()
    thresholds: ClassVar[tuple[Threshold, ...]] = ()
    margins: ClassVar[tuple[Margin, ...]] = ()
    view_columns: ClassVar[tuple[tuple[str, str], ...]] = ()  # (column in requests_joined, "value"|"passed")
    canned_queries: ClassVar[tuple[CannedQuery, ...]] = ()
    # plot the newest grade's value against a case field, per variant: (case field, x label, y label)
    scatter: ClassVar[tuple[str, str, str] | None] = None
    # the detail fields of its newest grade of which one is set (not null, false, 0 or "") on every
    # row its `notes` can speak of: a report hands `notes` those rows only; None: every row
    notes_where: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def headline_keys(cls) -> tuple[str, ...]:
        return cls.headline or tuple(c.key for c in cls.columns[:1])

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Aggregate the grader's newest grades of one slice (rows with value, passed, detail,
        case_id, repeat) into the keys of ``columns``. ``base_grades`` is the baseline's same slice
        (None when the slice is the baseline's own). The default: the mean value, as the first column."""
        if not cls.columns:
            return {}
        return {cls.columns[0].key: mean([g["value"] for g in grades if g["value"] is not None])}

    @classmethod
    def summary_sql(cls) -> dict[str, str] | None:
        """`summarise` declared: column key -> a DuckDB aggregate over one slice's newest grades
        (columns ``value``, ``passed``, ``detail_json``; `catalogue.detail_sql`, `pct_sql` help),
        so the ledger computes the quality table where the grades are. It cannot read the
        baseline's grades. None: not declared, the grades are read and handed to `summarise`. The
        default declares the default `summarise` (`declared_summary`)."""
        return {cls.columns[0].key: "avg(value)"} if cls.columns else {}

    @classmethod
    def summary_from_cases(cls, mine: dict[str, dict[str, float]] | None, base: dict[str, dict[str, float]]
                           ) -> dict[str, Any] | None:
        """`summarise` declared through per-case values, where it needs the baseline's or a test
        over cases: ``mine``: margin -> case -> this slice's `case_values(False)` (None for the
        baseline's own slice); ``base``: the baseline's same slice, `case_values(True)`. The ledger
        computes both where the grades are and no grade is read. None (the default): not declared."""
        return None

    @classmethod
    def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        """margin name -> case -> one side's per-case value, from the newest grades of that side.
        The default: the mean `value` over the case's repeats, or for a "pp" margin whether the
        case's first repeat passed (1.0 or 0.0). ``baseline_side``: these are the baseline's grades
        (drift reads its noise floor there)."""
        return {m.name: _per_case(grades, m.unit == "pp") for m in cls.margins}

    @classmethod
    def case_values(cls, baseline_side: bool) -> dict[str, CaseValue] | None:
        """`margin_values` declared, margin name -> `CaseValue`, so the ledger computes each side's
        per-case values where the grades are (quality under load reads no grade); None: not
        declared, the grades are read and handed to `margin_values`. The default declares the
        default `margin_values`; an aggregate that overrides `margin_values` declares its own, or
        is read through it (`declared_case_values`)."""
        return {m.name: CaseValue("passed", first=True) if m.unit == "pp" else CaseValue("value") for m in cls.margins}

    @classmethod
    def notes(cls, rows: list[dict[str, Any]]) -> list[str]:
        """Lines for the report about individual outputs (rows carry `grades`, `id`, `variant`,
        `case_id`), e.g. where two estimators disagree. None by default."""
        return []


class Grader:
    """Scoring only. Per-request graders implement `grade` (or `grade_batch`); per-pair and per-run
    graders implement `grade_outputs`, which sees every output of the run at once. What the grades
    become in reports, gates and margins is declared beside it, in ``aggregate``."""

    name: ClassVar[str]
    version: ClassVar[str]
    kind: ClassVar[Kind] = "request"
    default: ClassVar[bool] = True  # run by `evalkit run` / `evalkit grade` when the matrix names no graders
    description: ClassVar[str] = ""
    # case attributes the grader reads (beyond id, messages and text): a run whose cases lack them
    # skips the grader with one line instead of grading into meaningless numbers
    requires: ClassVar[tuple[str, ...]] = ()
    # a pydantic model the attributes it reads must satisfy: a case that carries them badly is a
    # dataset error naming its line and field before anything is sent
    attributes_model: ClassVar[type[BaseModel] | None] = None
    aggregate: ClassVar[type[Aggregate]] = Aggregate
    # a labelled file (relative to the rubrics folder) that `evalkit graders calibrate` checks it on
    calibration_file: ClassVar[str | None] = None

    @classmethod
    def from_context(cls, ctx: GraderContext) -> Grader:
        return cls()

    def grade(self, item: GradedRequest) -> Score:
        raise NotImplementedError(f"grader '{self.name}' grades whole runs (grade_outputs), not single requests")

    def grade_batch(self, items: list[GradedRequest]) -> list[Score]:
        return [self.grade(i) for i in items]

    def grade_outputs(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str | None) -> dict[int, Score]:
        """request id -> score. The default grades each request on its own."""
        return {i.request_id: s for i, s in zip(items, self.grade_batch(items), strict=True)}

    @classmethod
    def check_case(cls, case: Case) -> str | None:
        """Why this case's attributes cannot be graded (`field: problem`), or None. A plugin may
        write it as a plain method too (`hook` calls either, on a bare instance)."""
        if cls.attributes_model is None:
            return None
        try:
            cls.attributes_model.model_validate(case.attributes)
        except ValidationError as e:
            err = e.errors()[0]
            return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
        return None

    @classmethod
    def validate_rubrics(cls, rubrics: Any) -> str | None:
        """Load this grader's rubric files from the folder ``rubrics``; a short description of
        what was loaded, or None when the grader has none. Errors are RubricError (file:line)."""
        return None

    @classmethod
    def calibrate(cls, path: Any = None) -> dict[str, Any]:
        raise NotImplementedError(f"grader '{cls.name}' has no calibration data")

    @classmethod
    def calibration_lines(cls, result: dict[str, Any]) -> list[str]:
        """A calibration result as text lines (the CLI prints them)."""
        return [f"{k}: {v}" for k, v in result.items()]


GRADER_HOOKS = frozenset({"check_case", "from_context", "validate_rubrics", "calibrate", "calibration_lines"})


def hook(grader: type[Grader], name: str, *args: Any, where: str = "") -> Any:
    """Call one of a grader's class-level hooks (``GRADER_HOOKS``) or its aggregate's, as
    docs/plugins.md writes them: a classmethod (or staticmethod) on the class, a plain method on a
    bare instance (made without `__init__` or `from_context`: these hooks run before any grader
    is built, so they read class attributes only). Anything the hook raises becomes one line naming
    the grader and the hook (``where``: e.g. the row it was called on)."""
    owner: type = grader if name in GRADER_HOOKS else grader.aggregate
    static = inspect.getattr_static(owner, name, None)
    fn = getattr(owner, name) if static is None or isinstance(static, classmethod | staticmethod) \
        else getattr(object.__new__(owner), name)
    try:
        return fn(*args)
    except EvalkitError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin's bug is one line, never a traceback
        of = "" if owner is grader else "aggregate's "
        msg = (str(e).strip().splitlines() or [""])[0]
        raise PluginError(f"grader '{grader.name}': its {of}hook `{name}` raised {type(e).__name__}"
                          f"{': ' + msg[:200] if msg else ''}{where}") from None


def _declared_beside(agg: type, declaration: str, computed_by: str) -> bool:
    """Whether ``agg``'s ``declaration`` is set by the class that defines its hook ``computed_by``
    or a subclass of it: one that overrides the hook alone inherits a declaration of something else."""
    def owner(name: str) -> type | None:
        return next((k for k in agg.__mro__ if name in k.__dict__), None)

    declares, computes = owner(declaration), owner(computed_by)
    return declares is not None and (computes is None or issubclass(declares, computes))


def declared_notes_where(grader: type[Grader]) -> tuple[str, ...] | None:
    """A grader's aggregate's `notes_where` where it declares what its `notes` reads: set by the
    class that defines `notes` or a subclass of it (one that overrides `notes` alone is handed
    every row)."""
    agg = grader.aggregate
    if not _declared_beside(agg, "notes_where", "notes"):
        return None
    got = agg.notes_where
    if got is not None and (not isinstance(got, tuple) or not got or not all(isinstance(f, str) and f.isidentifier()
                                                                              for f in got)):
        raise PluginError(f"grader '{grader.name}': its aggregate's `notes_where` must be a tuple of detail keys "
                          "(letters, digits and _), or None")
    return got


def declared_summary(grader: type[Grader]) -> dict[str, str] | None:
    """A grader's aggregate's `summary_sql` where it declares its `summarise` (set beside it, as
    `declared_case_values`), else None: its grades are handed to `summarise`."""
    if not _declared_beside(grader.aggregate, "summary_sql", "summarise"):
        return None
    got = hook(grader, "summary_sql")
    if got is not None and (not isinstance(got, dict) or not all(isinstance(k, str) and k.isidentifier()
                                                                 and isinstance(v, str) for k, v in got.items())):
        raise PluginError(f"grader '{grader.name}': its aggregate's hook `summary_sql` must return a dict of column "
                          "key -> SQL, or None")
    return got


def declared_case_summary(grader: type[Grader]) -> tuple[dict[str, CaseValue], dict[str, CaseValue]] | None:
    """A grader's per-case values on each side (`case_values(False)`, `case_values(True)`) where its
    aggregate declares its `summarise` through them (`summary_from_cases`, set beside it, with its
    `case_values` declared); else None."""
    agg = grader.aggregate
    owner = next((k for k in agg.__mro__ if "summary_from_cases" in k.__dict__), None)
    if owner in (None, Aggregate) or not _declared_beside(agg, "summary_from_cases", "summarise"):
        return None
    mine, theirs = declared_case_values(grader, False), declared_case_values(grader, True)
    return None if mine is None or theirs is None else (mine, theirs)


def declared_case_values(grader: type[Grader], baseline_side: bool) -> dict[str, CaseValue] | None:
    """A grader's aggregate's `case_values` (through `hook`) where they declare its `margin_values`:
    the class that declares them is the one that defines `margin_values`, or a subclass of it (a
    plugin that overrides `margin_values` alone inherits a declaration of something else, and is
    read through its own)."""
    if not _declared_beside(grader.aggregate, "case_values", "margin_values"):
        return None
    got = hook(grader, "case_values", baseline_side)
    if got is not None and (not isinstance(got, dict) or not all(isinstance(v, CaseValue) for v in got.values())):
        raise PluginError(f"grader '{grader.name}': its aggregate's hook `case_values` must return a dict of margin "
                          "name -> CaseValue, or None")
    return got


def paired_differences(agg: type[Aggregate] | type[Grader], grades: list[dict[str, Any]],
                       base_grades: list[dict[str, Any]] | None = None,
                       base_values: Mapping[str, Mapping[str, float]] | None = None,
                       values: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, list[float]]:
    """margin name -> candidate-minus-baseline per-case differences, for the cases both have.
    ``base_values``, ``values``: the baseline's or the candidate's side of `margin_values`, when
    computed before (their grades gone, or taken a chunk at a time). ``agg``: a grader (its
    aggregate's `margin_values` called through `hook`), or the aggregate itself."""
    def side(gs: list[dict[str, Any]], baseline_side: bool) -> Any:
        if isinstance(agg, type) and issubclass(agg, Grader):
            return hook(agg, "margin_values", gs, baseline_side)
        return agg.margin_values(gs, baseline_side)

    a = values if values is not None else side(grades, False)
    b = base_values if base_values is not None else side(base_grades or [], True)
    out = {}
    for m, mine in a.items():
        theirs = b.get(m, {})
        # membership, not a set of each side's keys: the baseline side may be packed (`PairValues`)
        out[m] = [mine[c] - theirs[c] for c in sorted(c for c in mine if c in theirs)]
    return out


def pass_pct(grades: list[dict[str, Any]]) -> float | None:
    passed = [g["passed"] for g in grades if g["passed"] is not None]
    return 100.0 * sum(passed) / len(passed) if passed else None


def bare_case(case_id: str = "case", *, formality: int = 3, schema: str = "outreach_email",
              task: str = "cold_outreach") -> Case:
    """A case with only what text-only graders read (the formality level, the schema): how the
    `evaluate` modules hand plain texts to the real graders."""
    from ..spec.output_schemas import load_schema

    return Case.model_validate({"id": case_id, "messages": [{"role": "user", "content": "-"}], "schema": schema,
                                "schema_doc": load_schema(schema), "formality": formality, "task": task})


def _per_case(grades: list[dict[str, Any]], pass_rate: bool) -> dict[str, float]:
    """case -> mean value of its newest grades; for a pass rate, 1.0 or 0.0 from its first repeat."""
    if pass_rate:
        first: dict[str, tuple[int, float]] = {}
        for g in grades:
            rep = g.get("repeat") or 0
            if g["passed"] is not None and (g["case_id"] not in first or rep < first[g["case_id"]][0]):
                first[g["case_id"]] = (rep, float(bool(g["passed"])))
        return {k: v for k, (_, v) in first.items()}
    acc: dict[str, list[float]] = {}
    for g in grades:
        if g["value"] is not None:
            acc.setdefault(g["case_id"], []).append(float(g["value"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}
