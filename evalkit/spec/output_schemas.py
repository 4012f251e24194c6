"""Output JSON Schemas (rubrics/schemas/NAME.schema.json), loaded and checked once."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ..errors import RubricError
from ..paths import schemas_dir

SUFFIX = ".schema.json"


def known_schema_names(directory: Path | None = None) -> set[str]:
    d = directory or schemas_dir()
    return {p.name[: -len(SUFFIX)] for p in d.glob(f"*{SUFFIX}")}


@lru_cache(maxsize=64)
def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        schema = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RubricError(f"{p}: schema file not found") from None
    except json.JSONDecodeError as e:
        raise RubricError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    return check_schema(schema, str(p))


def load_schema(name: str, directory: Path | None = None) -> dict[str, Any]:
    d = directory or schemas_dir()
    return _load(str(d / f"{name}{SUFFIX}"))


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON Schema given inline or read from a file, checked; RubricError names where."""
    if not isinstance(schema, dict):
        raise RubricError(f"{where}: a JSON Schema must be an object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        at = "/".join(str(x) for x in e.path) or "(root)"
        raise RubricError(f"{where}: field '{at}': invalid JSON Schema: {e.message}") from None
    return schema


def schema_search_path(workload_schemas: Path | None = None) -> list[Path]:
    """Where a schema's name is looked up: the workload's schemas folder, then the shipped one."""
    return [d for d in (workload_schemas, schemas_dir()) if d is not None]
