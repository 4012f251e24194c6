"""A workload's cases: JSON lines, validated strictly, with a stratified subset.

A case needs only an `id` and its `messages`. It may name a `schema` for its answer (a schema's
name from the workload's `schemas/` or the shipped ones, a path relative to the dataset, or the
schema inline), a `reference` answer for graders that want one, a `complexity` (a slice the
report keeps), follow-up `turns`, and any other field: those are the case's *attributes*, usable
for slicing (`report --by category`) and by graders that declare they need them (the shipped
resume workload's persona, candidate, formality and context_keys are attributes its persona and
formality graders validate; docs/workloads.md).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, ValidationError, model_validator

from ..errors import DatasetError, RubricError
from ..paths import default_dataset_path
from .config import json_rows, read_text
from .output_schemas import check_schema, schema_search_path

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
KNOWN = ("id", "messages", "schema", "reference", "complexity", "turns", "max_tokens", "meta", "attributes",
         "schema_doc")


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    id: str = Field(min_length=1, description="the case's name, unique in its dataset")
    messages: list[Message] = Field(min_length=1, description="the chat sent: each a role and its content")
    schema_: str | dict[str, Any] | None = Field(None, alias="schema", description="a name, a path, or inline")
    reference: str | None = Field(None, description="an expected answer, for graders that compare with one")
    complexity: str | None = Field(None, description="a slice the report keeps (the shipped: short, medium, long)")
    turns: list[Turn] = Field(default_factory=list, description="follow-ups: a conversation, one row per turn")
    max_tokens: int | None = Field(None, ge=1, description="this case's output length (a trace row's)")
    meta: dict[str, int | float | str | None] = Field(default_factory=dict, description="carried to its rows")
    attributes: dict[str, Any] = Field(default_factory=dict, description="every other field of the row")
    schema_doc: dict[str, Any] | None = Field(None, description="the resolved JSON Schema (set when loaded)")
    _line: int = PrivateAttr(0)

    @model_validator(mode="before")
    @classmethod
    def _attributes(cls, data: Any) -> Any:
        """Every field a case does not define is one of its attributes."""
        if not isinstance(data, dict):
            return data
        extra = {k: v for k, v in data.items() if k not in KNOWN}
        if not extra:
            return data
        return {**{k: v for k, v in data.items() if k in KNOWN},
                "attributes": {**(data.get("attributes") or {}), **extra}}

    @property
    def schema_name(self) -> str | None:
        """The schema's name as the case gave it (a path's file name; "inline" for an object)."""
        if self.schema_ is None:
            return None
        if isinstance(self.schema_, dict):
            return str(self.schema_.get("title") or "inline")
        return Path(self.schema_).name.removesuffix(".json").removesuffix(".schema") if "/" in self.schema_ \
            or self.schema_.endswith(".json") else self.schema_

    def has(self, key: str) -> bool:
        """Whether the case carries a field a grader needs (a defined field, or an attribute)."""
        if key in ("schema", "reference", "complexity"):
            return getattr(self, "schema_" if key == "schema" else key) is not None
        return self.attributes.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """A slicing key's value: a defined field or an attribute."""
        if key in ("complexity", "reference"):
            return getattr(self, key)
        if key == "schema":
            return self.schema_name
        return self.attributes.get(key, default)

    def turn_case(self, k: int) -> Case:
        """Turn k of a conversation as a case of its own (id `case#tk`): its user message and, when
        the turn asks for one, its formality level, so every grader grades each turn."""
        if k == 0:
            return self
        turn = self.turns[k - 1]
        attrs = {**self.attributes, **({"formality": turn.formality} if turn.formality else {})}
        return self.model_copy(update={"id": f"{self.id}#t{k}", "attributes": attrs,
                                       "messages": [Message(role="user", content=turn.content)], "turns": []})


def _field_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(row)"


def resolve_schema(case: Case, dataset_dir: Path, search: list[Path]) -> dict[str, Any] | None:
    """The JSON Schema a case names: inline, a path relative to the dataset, or a name in the
    workload's schemas folder, then the shipped one."""
    ref = case.schema_
    if ref is None:
        return None
    if isinstance(ref, dict):
        return check_schema(ref, f"case {case.id}: inline schema")
    if "/" in ref or ref.endswith(".json"):
        return check_schema(_read_json(dataset_dir / ref), str(dataset_dir / ref))
    for d in search:
        p = d / f"{ref}.schema.json"
        if p.exists():
            return check_schema(_read_json(p), str(p))
    known = sorted({p.name.removesuffix(".schema.json") for d in search for p in d.glob("*.schema.json")})
    raise KeyError(f"unknown schema '{ref}' (known: {', '.join(known) or 'none'}; or give a path relative to the "
                   "dataset, or the schema inline)")


def _read_json(p: Path) -> dict[str, Any]:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KeyError(f"schema file {p} not found") from None
    except json.JSONDecodeError as e:
        raise KeyError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None


def load_cases(path: str | Path | None = None, schemas_dir: Path | None = None,
               default_schema: str | dict[str, Any] | None = None) -> list[Case]:
    """Load and validate every row; the first bad row raises DatasetError naming file:line, field.
    ``schemas_dir``: the workload's schemas, searched before the shipped ones. ``default_schema``
    (a matrix's `default_schema:`): the schema of every row that names none, checked once, as a
    row's would be."""
    p = Path(path) if path else default_dataset_path()
    text = read_text(p, DatasetError, "dataset")
    search = schema_search_path(schemas_dir)
    if default_schema is not None:
        probe = Case.model_validate({"id": "default", "messages": [{"role": "user", "content": "-"}],
                                     "schema": default_schema})
        try:
            resolve_schema(probe, p.parent, search)
        except (KeyError, RubricError) as e:
            raise DatasetError(f"matrix field 'default_schema': {e.args[0] if isinstance(e, KeyError) else e}") from None
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for lineno, row in json_rows(p, text, DatasetError):
        try:
            case = Case.model_validate(row)
        except ValidationError as e:
            err = e.errors()[0]
            loc = tuple(err["loc"])
            raise DatasetError(f"{p}:{lineno}: field '{_field_path(loc)}': {err['msg']}") from None
        if case.schema_ is None and default_schema is not None:
            case.schema_ = default_schema
        if case.attributes.get("task") == "trace":
            raise DatasetError(f"{p}:{lineno}: field 'task': 'trace' is for trace replay (--trace), not a dataset row")
        try:
            case.schema_doc = resolve_schema(case, p.parent, search)
        except (KeyError, RubricError) as e:
            raise DatasetError(f"{p}:{lineno}: field 'schema': {e.args[0] if isinstance(e, KeyError) else e}") from None
        if case.id in seen:
            raise DatasetError(f"{p}:{lineno}: field 'id': duplicate id '{case.id}' (first on line {seen[case.id]})")
        seen[case.id] = lineno
        case._line = lineno
        cases.append(case)
    if not cases:
        raise DatasetError(f"{p}: the dataset has no rows")
    return cases


def dataset_hash(path: str | Path | None = None) -> str:
    p = Path(path) if path else default_dataset_path()
    return hashlib.sha256(p.read_bytes()).hexdigest()


def stratified_subset(cases: list[Case], limit: int | None, subset_seed: int = 0) -> list[Case]:
    """Pick ``limit`` cases spread evenly over (complexity, task) strata, deterministically (a
    workload without those attributes is one stratum).

    Within a stratum the order is a seeded shuffle, so other attributes spread too. The result is
    ordered stratum-round-robin, so any prefix is itself balanced.
    """
    if limit is None:
        return list(cases)
    limit = min(limit, len(cases))
    if limit < 1:
        raise DatasetError(f"--limit must be at least 1, got {limit}")
    strata: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in sorted(cases, key=lambda c: c.id):
        strata[(c.complexity or "", str(c.attributes.get("task") or ""))].append(c)
    rng = random.Random(subset_seed)
    order = {cx: i for i, cx in enumerate(COMPLEXITIES)}
    # complexity varies fastest, so even --limit 3 gets one short, one medium and one long case
    keys = sorted(strata, key=lambda k: (k[1], order.get(k[0], len(order)), k[0]))
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


def strata(cases: list[Case]) -> int:
    """How many (complexity, task) strata the cases fall in: a time budget keeps whole rounds of them."""
    return max(1, len({(c.complexity, c.attributes.get("task")) for c in cases}))


def dataset_summary(cases: list[Case]) -> str:
    """`N cases OK (long a, medium b, short c)`: what `dataset validate` says."""
    by: dict[str, int] = {}
    for c in cases:
        if c.complexity:
            by[c.complexity] = by.get(c.complexity, 0) + 1
    attrs = sorted({k for c in cases for k in c.attributes})
    return (f"{len(cases)} cases OK" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))})" if by else "")
            + (f"; attributes: {', '.join(attrs)}" if attrs else ""))
