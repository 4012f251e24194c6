"""Text helpers shared by graders: the prose inside an output (JSON or not), words, sentences."""

from __future__ import annotations

import json
import re

WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")


def prose(text: str) -> str:
    """All string values of a JSON output joined (subject, body, sign-off...), or the text itself."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return text
    parts: list[str] = []

    def walk(x: object) -> None:
        if isinstance(x, str):
            parts.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(obj)
    return "\n".join(parts) if parts else text


def json_fields(text: str) -> dict[str, str] | None:
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(obj, dict):
        return None
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in obj.items()}


def words(text: str) -> list[str]:
    return WORD.findall(text)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_SPLIT.split(text) if s and s.strip()]
