"""What the stub answers: JSON that validates against the request's schema (its shape, readable
"Stub answer for ..." text), a plain deterministic sentence otherwise, and, for an accuracy suite,
sums answered right a known share of the time (`answer_sum`): a test then knows every item's
grade before the run (issue 49)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .schema_instances import instance

SUM = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")


def _fill(schema: dict[str, Any], hint: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    t = schema.get("type")
    if t == "object":
        return {k: _fill(v, f"{hint} {k}") for k, v in schema.get("properties", {}).items()}
    if t == "array":
        n = max(1, schema.get("minItems", 1))
        return [_fill(schema.get("items", {"type": "string"}), hint) for _ in range(n)]
    if t == "integer":
        return schema.get("minimum", 1)
    if t == "number":
        return float(schema.get("minimum", 1))
    if t == "boolean":
        return True
    text = f"Stub answer for {hint.strip()}."
    lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10_000)
    while len(text) < lo:
        text += " More detail follows here."
    return text[:hi]


def _text(content: Any) -> str:
    """Message content as text: a string, or OpenAI-style parts [{"type": "text", "text": ...}]."""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def answer_sum(question: str, accuracy: float, seed: int = 0) -> str | None:
    """A "What is A + B?" question answered GSM8K-style (`#### N`): right when a seeded hash of the
    sum asked (not of the prompt around it, which a suite words its own way) falls below
    ``accuracy``, else one off. None for any other question."""
    m = SUM.search(question)
    if m is None:
        return None
    total = int(m.group(1)) + int(m.group(2))
    draw = int(hashlib.sha256(f"{seed}:{m.group(0)}".encode()).hexdigest()[:8], 16) / 16**8
    return f"Adding them gives the total.\n#### {total if draw < accuracy else total + 1}"


def answer_text(body: dict[str, Any], tag: str = "the request", sum_accuracy: float | None = None,
                seed: int = 0) -> str:
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema") or {}
        return json.dumps(instance(schema, _fill(schema, tag)))  # valid whatever its keywords
    last = next((_text(m.get("content")) for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
    if sum_accuracy is not None and (said := answer_sum(last, sum_accuracy, seed)) is not None:
        return said
    return f"This is a stub reply to a prompt of {len(last.split())} words. It is deterministic and plain."


