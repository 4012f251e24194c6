"""Load YAML config files (matrix, rubrics) into pydantic models; errors name file:line, field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import UsageError

M = TypeVar("M", bound=BaseModel)


def node_line(root: yaml.Node | None, loc: tuple) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a 1-based line."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if k.value == key), None)
            if nxt is None:  # an unknown key: point at the key itself
                nxt = next((k for k, _ in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            nxt = node.value[key]
        else:
            nxt = None
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line


def read_text(path: Path, error: type[UsageError], kind: str) -> str:
    """A user's input file as text; a missing or unreadable one is a one-line error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {kind} file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read {kind}: {e}") from None


def json_rows(path: Path, text: str, error: type[UsageError]) -> Iterator[tuple[int, dict[str, Any]]]:
    """A JSONL file's objects with their line numbers (blank lines skipped); a line that is not a
    JSON object is a one-line error naming file:line."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise error(f"{path}:{lineno}: a row must be a JSON object")
        yield lineno, obj


def load_yaml_model(path: Path, model: type[M], error: type[UsageError], kind: str) -> M:
    text = read_text(path, error, kind)
    try:
        root = yaml.compose(text)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise error(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise error(f"{path}:1: a {kind} must be a YAML mapping")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(x) for x in loc) or f"({kind})"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise error(f"{path}:{node_line(root, loc)}: field '{field}': {msg}") from None


def jsonl_objects(p: Path, kind: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a JSON-lines file; a missing file or a
    line that is not JSON is a usage error naming the file (and line). The caller checks the fields."""
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{p}: {kind} not found") from None
    for i, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield i, json.loads(line)
            except ValueError:
                raise UsageError(f"{p}:{i}: not a JSON object") from None
