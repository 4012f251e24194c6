"""What a grader is (after inspect_ai's Score and llm's plugin hooks): a class that declares its
name, version, kind, the columns it adds and how it is summarised, and returns a value, pass/fail,
an explanation and raw detail per request. The registry finds graders through entry points."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..dataset import Case
from ..stats import mean

Kind = Literal["request", "pair", "run"]


@dataclass
class Score:
    value: float
    passed: bool | None
    explanation: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class GradedRequest:
    """What a grader sees of one ledger row."""

    request_id: int
    variant: str
    text: str
    finish_reason: str | None
    case: Case


@dataclass(frozen=True)
class SummaryColumn:
    """One column a grader adds to the report's quality table (and the HTML, card, Datasette)."""

    key: str
    label: str
    digits: int | None = 2
    description: str = ""


@dataclass
class GraderContext:
    """What a grader may need from the run: the matrix's judge section, the embedding function."""

    judge: Any = None
    embed: Callable[[list[str]], Any] | None = None


class Grader:
    """Base class. Per-request graders implement `grade` (or `grade_batch`); per-pair and per-run
    graders implement `grade_run`, which sees every output of the run at once."""

    name: ClassVar[str]
    version: ClassVar[str]
    kind: ClassVar[Kind] = "request"
    default: ClassVar[bool] = True  # run by `evalkit run` / `evalkit grade` without --grader
    description: ClassVar[str] = ""
    view_columns: ClassVar[tuple[tuple[str, str], ...]] = ()  # (column in requests_joined, "value"|"passed")
    summary_columns: ClassVar[tuple[SummaryColumn, ...]] = ()

    @classmethod
    def from_context(cls, ctx: GraderContext) -> Grader:
        return cls()

    def grade(self, item: GradedRequest) -> Score:
        raise NotImplementedError(f"grader '{self.name}' grades whole runs (grade_run), not single requests")

    def grade_batch(self, items: list[GradedRequest]) -> list[Score]:
        return [self.grade(i) for i in items]

    def grade_run(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str | None) -> dict[int, Score]:
        """request id -> score. The default grades each request on its own."""
        return {i.request_id: s for i, s in zip(items, self.grade_batch(items), strict=True)}

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Aggregate this grader's newest grades of one slice (rows with value, passed, detail,
        case_id) into the keys of `summary_columns`. ``base_grades`` is the baseline's same slice
        (None when the slice is the baseline's own)."""
        if not cls.summary_columns:
            return {}
        return {cls.summary_columns[0].key: mean([g["value"] for g in grades if g["value"] is not None])}


def pass_pct(grades: list[dict[str, Any]]) -> float | None:
    passed = [g["passed"] for g in grades if g["passed"] is not None]
    return 100.0 * sum(passed) / len(passed) if passed else None


def bare_case(case_id: str = "case", *, formality: int = 3, schema: str = "outreach_email",
              task: str = "cold_outreach") -> Case:
    """A case with only what text-only graders read (formality level, schema name): how the
    `evaluate` modules hand plain texts to the real graders."""
    return Case.model_validate({
        "id": case_id, "task": task, "persona": "unspecified", "candidate": "unspecified", "complexity": "short",
        "formality": formality, "schema": schema,
        "context_keys": {"company": "-", "role": "-", "skills": ["-"]},
        "messages": [{"role": "user", "content": "-"}],
    })
