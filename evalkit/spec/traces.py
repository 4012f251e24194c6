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
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError

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


def _json_rows(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """A JSONL file's objects with their line numbers, read as they come (blank lines skipped)."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}:{lineno}: a row must be a JSON object")
        yield lineno, obj


def _jsonl(path: Path, f: IO[str], fmt: str) -> Iterator[TraceRow]:
    for n, obj in _json_rows(path, f):
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
            yield TraceRow(n, ts / 1000.0, _int(obj.get("input_length"), where, "input_length", 1),
                           _int(obj.get("output_length"), where, "output_length", 1), ids)
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
            yield TraceRow(n, float(off), None, _int(mt, where, "max_tokens", 1) if mt is not None else None,
                           messages=msgs, id=str(obj["id"]) if obj.get("id") is not None else None)


def _csv(path: Path, f: IO[str], fmt: str) -> Iterator[TraceRow]:
    reader = csv.DictReader(f)
    need = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
            "burstgpt": ("Timestamp", "Request tokens", "Response tokens")}[fmt]
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{path}:1: not a {fmt} trace: missing column(s) {', '.join(missing)} "
                         f"(has: {', '.join(reader.fieldnames or []) or 'nothing'})")
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
        yield TraceRow(i, off, _int(rec[need[1]], where, need[1], 1), _int(rec[need[2]], where, need[2], 1))


def iter_trace(path: Path, fmt: str) -> Iterator[TraceRow]:
    """The trace's rows as the file is read (a trace of millions of rows is never held), each
    validated; offsets rebased to the first row and required not to go down."""
    if fmt not in FORMATS:
        raise TraceError(f"--trace-format: unknown format '{fmt}' (known: {', '.join(FORMATS)})")
    try:
        with path.open(encoding="utf-8", newline="" if fmt in ("azure", "burstgpt") else None) as f:
            rows = _jsonl(path, f, fmt) if fmt in ("mooncake", "evalkit") else _csv(path, f, fmt)
            prev: TraceRow | None = None
            base = 0.0
            for r in rows:
                if prev is None:
                    if r.offset_s < 0 and fmt != "burstgpt":  # BurstGPT's clock starts anywhere
                        raise TraceError(f"{path}:{r.index}: the first arrival is negative ({r.offset_s:g} s)")
                    base = r.offset_s
                elif r.offset_s < prev.offset_s:
                    shift = base if fmt == "burstgpt" else 0.0  # the offsets as the trace's own clock reads them
                    raise TraceError(f"{path}:{r.index}: arrival {r.offset_s - shift:g} s comes before the previous "
                                     f"row's {prev.offset_s - shift:g} s (a trace must be in time order)")
                prev = TraceRow(r.index, r.offset_s)
                r.offset_s -= base
                yield r
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read trace: {e}") from None


def load_trace(path: Path, fmt: str, limit: int | None = None) -> list[TraceRow]:
    """The first ``limit`` rows (every row without one), validated: the file is read only as far
    as they go."""
    rows = list(islice(iter_trace(path, fmt), limit)) if limit else list(iter_trace(path, fmt))
    if not rows:
        raise TraceError(f"{path}: the trace has no rows")
    return rows
