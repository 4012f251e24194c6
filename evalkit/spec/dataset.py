"""The benchmark dataset: JSON lines of cases, validated strictly, with a stratified subset."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from ..errors import DatasetError
from ..paths import default_dataset_path
from .config import json_rows, read_text
from .output_schemas import known_schema_names

Complexity = Literal["short", "medium", "long"]
COMPLEXITIES: tuple[str, ...] = ("short", "medium", "long")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


class ContextKeys(BaseModel):
    """What a good answer must carry: the recipient's company and role, the matching skills."""

    model_config = ConfigDict(extra="forbid")
    company: str = Field(min_length=1)
    role: str = Field(min_length=1)
    skills: list[str] = Field(min_length=1)


class Turn(BaseModel):
    """A follow-up in a conversation: the user's next message, sent after the variant's own reply
    to everything before it, optionally asking for another formality level, after a think time."""

    model_config = ConfigDict(extra="forbid")
    content: str = Field(min_length=1)
    formality: StrictInt | None = Field(None, ge=1, le=5)
    think_time_s: float = Field(0.0, ge=0, le=600)


# Fields a trace's synthetic case carries to its ledger rows (where the request came from).
TRACE_FIELDS = ("trace_row", "trace_input_tokens", "trace_output_tokens", "designed_shared_tokens")


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    task: Literal["cold_outreach", "profile_rewrite", "trace"]
    persona: str = Field(min_length=1)
    persona_title: str = ""
    persona_description: str = ""
    candidate: str = Field(min_length=1)
    complexity: Complexity
    formality: StrictInt = Field(ge=1, le=5)
    schema_: str = Field(alias="schema", min_length=1)
    context_keys: ContextKeys
    messages: list[Message] = Field(min_length=1)
    turns: list[Turn] = Field(default_factory=list, description="follow-ups: a conversation, one row per turn")
    max_tokens: int | None = Field(None, ge=1, description="this case's output length (a trace row's)")
    meta: dict[str, int | float | str | None] = Field(default_factory=dict, description="carried to its rows")

    @property
    def schema_name(self) -> str:
        return self.schema_

    def turn_case(self, k: int) -> Case:
        """Turn k of a conversation as a case of its own (id `case#tk`): its requested formality
        and its user message, so every grader grades each turn."""
        if k == 0:
            return self
        turn = self.turns[k - 1]
        return self.model_copy(update={"id": f"{self.id}#t{k}", "formality": turn.formality or self.formality,
                                       "messages": [Message(role="user", content=turn.content)], "turns": []})


def _field_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(row)"


def load_cases(path: str | Path | None = None, schemas_dir: Path | None = None) -> list[Case]:
    """Load and validate every row; the first bad row raises DatasetError naming file:line, field."""
    p = Path(path) if path else default_dataset_path()
    text = read_text(p, DatasetError, "dataset")
    known = known_schema_names(schemas_dir)
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for lineno, row in json_rows(p, text, DatasetError):
        try:
            case = Case.model_validate(row)
        except ValidationError as e:
            err = e.errors()[0]
            raise DatasetError(f"{p}:{lineno}: field '{_field_path(err['loc'])}': {err['msg']}") from None
        if case.task == "trace":
            raise DatasetError(f"{p}:{lineno}: field 'task': 'trace' is for trace replay (--trace), not a dataset row")
        if case.schema_name not in known:
            raise DatasetError(
                f"{p}:{lineno}: field 'schema': unknown schema '{case.schema_name}' "
                f"(known: {', '.join(sorted(known))})"
            )
        if case.id in seen:
            raise DatasetError(f"{p}:{lineno}: field 'id': duplicate id '{case.id}' (first on line {seen[case.id]})")
        seen[case.id] = lineno
        cases.append(case)
    if not cases:
        raise DatasetError(f"{p}: the dataset has no rows")
    return cases


def dataset_hash(path: str | Path | None = None) -> str:
    p = Path(path) if path else default_dataset_path()
    return hashlib.sha256(p.read_bytes()).hexdigest()


def stratified_subset(cases: list[Case], limit: int | None, subset_seed: int = 0) -> list[Case]:
    """Pick ``limit`` cases spread evenly over (complexity, task) strata, deterministically.

    Within a stratum the order is a seeded shuffle, so personas and formality levels spread too.
    The result is ordered stratum-round-robin, so any prefix is itself balanced.
    """
    if limit is None:
        return list(cases)
    limit = min(limit, len(cases))
    if limit < 1:
        raise DatasetError(f"--limit must be at least 1, got {limit}")
    strata: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in sorted(cases, key=lambda c: c.id):
        strata[(c.complexity, c.task)].append(c)
    rng = random.Random(subset_seed)
    # complexity varies fastest, so even --limit 3 gets one short, one medium and one long case
    keys = sorted(strata, key=lambda k: (k[1], COMPLEXITIES.index(k[0])))
    for k in keys:
        rng.shuffle(strata[k])
    out: list[Case] = []
    i = 0
    while len(out) < limit:
        for k in keys:
            if i < len(strata[k]) and len(out) < limit:
                out.append(strata[k][i])
        i += 1
    return out


def dataset_summary(cases: list[Case]) -> str:
    """`N cases OK (long a, medium b, short c)`: what `dataset validate` says."""
    by: dict[str, int] = {}
    for c in cases:
        by[c.complexity] = by.get(c.complexity, 0) + 1
    return f"{len(cases)} cases OK ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))})"
