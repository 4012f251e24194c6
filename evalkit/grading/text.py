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


# word tokens (apostrophes kept inside words) and single emoji / emoticons as tokens of their own
TOKEN = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?|[\U0001F300-\U0001FAFF\u2600-\u27BF]|(?<!\w)[:;]-?[)D(P](?!\w)")


def tokens(text: str) -> list[str]:
    return [t.lower().replace("’", "'") for t in TOKEN.findall(text)]


def terms(text: str) -> dict[str, set[str]]:
    """The candidate markers of a text: body words and word pairs, the opening (first one or two
    tokens, as `^w` / `^w w`) and the closing (pairs and words among the last six tokens, `w$`)."""
    ts = tokens(text)
    body = set(ts) | {f"{a} {b}" for a, b in zip(ts, ts[1:], strict=False)}
    opening = {f"^{ts[0]}"} | ({f"^{ts[0]} {ts[1]}"} if len(ts) > 1 else set()) if ts else set()
    tail = ts[-6:]
    closing = {f"{w}$" for w in tail} | {f"{a} {b}$" for a, b in zip(tail, tail[1:], strict=False)}
    return {"body": body, "opening": opening, "closing": closing}
