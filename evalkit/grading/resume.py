"""The shipped resume workload's case attributes, as its graders read them: a case of that
workload carries its task, recipient persona, candidate, requested formality (a strict integer
1-5) and the context a good answer must use. Any other workload's cases need none of these; the
persona and formality graders declare them (`requires`) and validate them here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from ..spec.dataset import Case, ContextKeys


class FormalityAttributes(BaseModel):
    model_config = ConfigDict(extra="ignore")
    formality: StrictInt = Field(ge=1, le=5)


class ResumeAttributes(FormalityAttributes):
    task: str = Field(min_length=1)
    persona: str = Field(min_length=1)
    persona_title: str = ""
    persona_description: str = ""
    candidate: str = Field(min_length=1)
    context_keys: ContextKeys


def resume(case: Case) -> ResumeAttributes:
    """A case's resume attributes (validated once, kept on the case)."""
    got: Any = case.__pydantic_private__.get("_resume") if case.__pydantic_private__ else None
    if got is None:
        got = ResumeAttributes.model_validate(case.attributes)
        case.__pydantic_private__["_resume"] = got  # type: ignore[index]
    return got


def formality_of(case: Case) -> int:
    return int(case.attributes["formality"])
