"""Answers that are instances of a request's JSON Schema, for the stub server. The stub's own
readable answer (`stub_text._fill`: the schema's shape with "Stub answer for ..." text) is kept
when it validates; when it does not (a `pattern`, a `format`, `oneOf`, bounds it cannot see), the
instance comes from hypothesis-jsonschema, a maintained generator that honours every keyword,
drawn derandomized (the same schema gives the same instance) and cached per schema."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator


def instance(schema: dict[str, Any], readable: Any) -> Any:
    """``readable`` when it is valid against ``schema``, else a generated instance of the schema."""
    try:
        if Draft202012Validator(schema).is_valid(readable):
            return readable
    except Exception:  # noqa: BLE001 - a schema the validator cannot read: let the generator say so
        pass
    return json.loads(_generated(json.dumps(schema, sort_keys=True)))


@lru_cache(maxsize=256)
def _generated(schema_json: str) -> str:
    from hypothesis import HealthCheck, given, settings
    from hypothesis_jsonschema import from_schema

    out: list[Any] = []

    @settings(database=None, max_examples=1, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(json.loads(schema_json)))
    def draw(x: Any) -> None:
        out.append(x)

    draw()
    return json.dumps(out[0])
