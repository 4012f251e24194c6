"""What every grader returns (after inspect_ai's Score): a value, pass/fail, why, and raw detail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..dataset import Case


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


class Grader(Protocol):
    name: str
    version: str

    def grade(self, item: GradedRequest) -> Score: ...
