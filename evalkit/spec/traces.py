"""Traces of real traffic: when requests arrived and how long they were, in the formats the load
tools read, validated row by row (file:line, field; exit 2; nothing written).

- `mooncake` (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (512-token
  prefix blocks; equal ids are a shared prefix). Mooncake's published traces; vLLM `bench serve`
  and GuideLLM read the same shape.
- `azure` (CSV): `TIMESTAMP` (a datetime), `ContextTokens`, `GeneratedTokens` (Azure's public
  LLM inference trace, 2023/2024).
- `burstgpt` (CSV): `Timestamp` (seconds), `Model`, `Request tokens`, `Response tokens`, `Log Type`
  (BurstGPT's published trace).
- `evalkit` (JSONL): real requests: `offset_s` (seconds from the first), `messages` (the OpenAI
  chat messages), optional `max_tokens`, optional `id` (the shape of an OpenAI request log).

Arrival offsets must not go down (every format here is a time-ordered log)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .config import json_rows, read_text

FORMATS = ("mooncake", "azure", "burstgpt", "evalkit")
BLOCK_TOKENS = 512  # Mooncake's hash_ids cover 512-token blocks


class TraceError(UsageError):
    """A trace file or row is invalid (file:line, field)."""


@dataclass
class TraceRow:
    index: int  # 1-based line (JSONL) or data row (CSV)
    offset_s: float
    input_tokens: int | None = None
    output_tokens: int | None = None
    hash_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, str]] | None = None
    id: str | None = None


def _int(v: Any, where: str, name: str, minimum: int = 0) -> int:
    try:
        x = int(float(v))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: field '{name}': not a number ({v!r})") from None
    if x < minimum:
        raise TraceError(f"{where}: field '{name}': must be at least {minimum}, got {x}")
    return x


def _jsonl(path: Path, text: str, fmt: str) -> list[TraceRow]:
    rows = []
    for n, obj in json_rows(path, text, TraceError):
        where = f"{path}:{n}"
        if fmt == "mooncake":
            if "timestamp" not in obj:
                raise TraceError(f"{where}: field 'timestamp': missing (milliseconds from the trace start)")
            ts = obj["timestamp"]
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                raise TraceError(f"{where}: field 'timestamp': not a number ({ts!r})")
            ids = obj.get("hash_ids") or []
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise TraceError(f"{where}: field 'hash_ids': a list of integers")
            rows.append(TraceRow(n, ts / 1000.0, _int(obj.get("input_length"), where, "input_length", 1),
                                 _int(obj.get("output_length"), where, "output_length", 1), ids))
        else:
            if "offset_s" not in obj:
                raise TraceError(f"{where}: field 'offset_s': missing (seconds from the trace start)")
            off = obj["offset_s"]
            if not isinstance(off, (int, float)) or isinstance(off, bool):
                raise TraceError(f"{where}: field 'offset_s': not a number ({off!r})")
            msgs = obj.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                    and isinstance(m.get("content"), str) and m["content"] for m in msgs):
                raise TraceError(f"{where}: field 'messages': a non-empty list of {{role, content}} with text")
            mt = obj.get("max_tokens")
            rows.append(TraceRow(n, float(off), None, _int(mt, where, "max_tokens", 1) if mt is not None else None,
                                 messages=msgs, id=str(obj["id"]) if obj.get("id") is not None else None))
    return rows


def _csv(path: Path, text: str, fmt: str) -> list[TraceRow]:
    reader = csv.DictReader(io.StringIO(text))
    need = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
            "burstgpt": ("Timestamp", "Request tokens", "Response tokens")}[fmt]
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{path}:1: not a {fmt} trace: missing column(s) {', '.join(missing)} "
                         f"(has: {', '.join(reader.fieldnames or []) or 'nothing'})")
    rows = []
    t0: datetime | None = None
    for i, rec in enumerate(reader, start=1):
        where = f"{path}:{i + 1}"
        ts = (rec.get(need[0]) or "").strip()
        if not ts:
            raise TraceError(f"{where}: field '{need[0]}': missing")
        if fmt == "azure":
            try:
                when = datetime.fromisoformat(ts[:26])  # Azure writes 7 fractional digits
            except ValueError:
                raise TraceError(f"{where}: field 'TIMESTAMP': not a date and time ({ts!r})") from None
            t0 = t0 or when
            off = (when - t0).total_seconds()
        else:
            try:
                off = float(ts)
            except ValueError:
                raise TraceError(f"{where}: field 'Timestamp': not a number of seconds ({ts!r})") from None
        rows.append(TraceRow(i, off, _int(rec[need[1]], where, need[1], 1), _int(rec[need[2]], where, need[2], 1)))
    if fmt == "burstgpt" and rows:
        base = rows[0].offset_s
        for r in rows:
            r.offset_s -= base
    return rows


def load_trace(path: Path, fmt: str, limit: int | None = None) -> list[TraceRow]:
    """Every row, validated; offsets rebased to the first row and required not to go down."""
    if fmt not in FORMATS:
        raise TraceError(f"--trace-format: unknown format '{fmt}' (known: {', '.join(FORMATS)})")
    text = read_text(path, TraceError, "trace")
    rows = _jsonl(path, text, fmt) if fmt in ("mooncake", "evalkit") else _csv(path, text, fmt)
    if not rows:
        raise TraceError(f"{path}: the trace has no rows")
    if rows[0].offset_s < 0:
        raise TraceError(f"{path}:{rows[0].index}: the first arrival is negative ({rows[0].offset_s:g} s)")
    for a, b in zip(rows, rows[1:], strict=False):
        if b.offset_s < a.offset_s:
            raise TraceError(f"{path}:{b.index}: arrival {b.offset_s:g} s comes before the previous row's "
                             f"{a.offset_s:g} s (a trace must be in time order)")
    base = rows[0].offset_s
    for r in rows:
        r.offset_s -= base
    return rows[:limit] if limit else rows
