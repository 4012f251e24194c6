"""`--suite` (and a matrix's `suites:`) into a run's cases (issue 49): alone, the suites are the
run's workload; with a dataset or a workload folder, both run. The cases a run sends are written
once to evalkit's cache as a dataset of their own (`suites/<hash>.jsonl`, built beside and
renamed), which the run records as its dataset: its hash pins them, and `--resume` reads them back
like any dataset."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..paths import cache_dir
from ..spec.dataset import Case
from ..suites import suite_cases


def case_row(c: Case) -> dict[str, Any]:
    """A case as a dataset row that loads back to the same case (its schema inline)."""
    row: dict[str, Any] = {**c.attributes, "id": c.id, "messages": [m.model_dump() for m in c.messages]}
    schema = c.schema_doc if c.schema_doc is not None else c.schema_
    for key, value in (("schema", schema), ("reference", c.reference), ("complexity", c.complexity),
                       ("max_tokens", c.max_tokens)):
        if value is not None:
            row[key] = value
    if c.turns:
        row["turns"] = [t.model_dump() for t in c.turns]
    if c.meta:
        row["meta"] = c.meta
    return row


def materialize(cases: Sequence[Case], folder: Path | None = None) -> Path:
    """The cases as one JSONL dataset in evalkit's cache, named by its content."""
    text = "".join(json.dumps(case_row(c), ensure_ascii=False, sort_keys=True) + "\n" for c in cases)
    folder = folder or cache_dir() / "suites"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path


def with_suites(cases: Sequence[Case], suites: Sequence[str], *, keep_dataset: bool, limit: int | None,
                seed: int) -> tuple[list[Case], Path]:
    """The run's cases with the suites' items (``keep_dataset``: beside the dataset's, else alone;
    ``limit``: a stratified subset of the suites' items, as of the dataset's), and their dataset file."""
    items = suite_cases(list(suites), limit=limit, seed=seed)
    out = [*cases, *items] if keep_dataset else items
    return out, materialize(out)
