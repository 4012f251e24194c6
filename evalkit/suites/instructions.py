"""The `instructions` suite and how instruction-following is scored.

Scoring follows IFEval. *Strict*: the response as it is follows the instruction. *Loose*: the
instruction is also tried on the response with its first line removed, its last line removed,
both, and each of those with every `*` removed (markdown emphasis); it passes loose when any
non-empty variant passes. Both are read at two levels: *prompt level* (every instruction of the
prompt passes) and *instruction level* (the share of all instructions that pass).

The shipped prompts (`data/instructions.jsonl`, written for evalkit) use IFEval's own
`input_data.jsonl` layout (`key`, `prompt`, `instruction_id_list`, `kwargs`), so they are read by
the same code as a user's `ifeval:FILE`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from ..errors import SuiteError
from .checks import INSTRUCTIONS, check, clean_kwargs
from .items import InstructionItem, Item, Suite

Unknown = Literal["error", "skip"]
DATA_FILE = "instructions.jsonl"


def loose_variants(text: str) -> list[str]:
    """The response as IFEval's loose scoring tries it: as it is, without its first line, its last
    line, both; and each of those with `*` removed."""
    lines = text.split("\n")
    first = "\n".join(lines[1:]).strip()
    last = "\n".join(lines[:-1]).strip()
    both = "\n".join(lines[1:-1]).strip()
    out = [text, first, last, both]
    return out + [v.replace("*", "") for v in out]


@dataclass(frozen=True)
class InstructionResult:
    id: str
    strict: bool
    loose: bool


def score_instructions(text: str, instructions: list[tuple[str, dict[str, Any]]]) -> list[InstructionResult]:
    """Each instruction's strict and loose result on one response."""
    variants = [v for v in loose_variants(text) if v.strip()]
    out = []
    for iid, kw in instructions:
        strict = check(iid, text, kw)
        loose = strict or any(check(iid, v, kw) for v in variants)
        out.append(InstructionResult(iid, strict, loose))
    return out


def parse_ifeval_row(row: dict[str, Any], where: str, unknown: Unknown = "error",
                     skipped: list[str] | None = None) -> InstructionItem | None:
    """One row of IFEval's `input_data.jsonl` layout as an item. ``where`` is `file:line`; a bad
    field is a SuiteError naming it. An unknown instruction id is an error, or with ``unknown``
    "skip" the instruction is left out (a note appended to ``skipped``; a prompt left with none is
    dropped: None)."""
    for key in ("key", "prompt", "instruction_id_list", "kwargs"):
        if key not in row:
            raise SuiteError(f"{where}: field '{key}': missing (IFEval layout: key, prompt, instruction_id_list, kwargs)")
    key, prompt, ids, kwargs = row["key"], row["prompt"], row["instruction_id_list"], row["kwargs"]
    if isinstance(key, bool) or not isinstance(key, (int, str)) or str(key).strip() == "":
        raise SuiteError(f"{where}: field 'key': expected an integer or a string, got {key!r}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise SuiteError(f"{where}: field 'prompt': expected a non-empty string")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise SuiteError(f"{where}: field 'instruction_id_list': expected a non-empty list of instruction ids")
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise SuiteError(f"{where}: field 'kwargs': expected a list of {len(ids)} objects, one per instruction")
    out: list[tuple[str, dict[str, Any]]] = []
    for n, (iid, kw) in enumerate(zip(ids, kwargs, strict=True)):
        if iid not in INSTRUCTIONS:
            if unknown == "skip":
                if skipped is not None:
                    skipped.append(f"{where}: instruction '{iid}' skipped (no checker)")
                continue
            raise SuiteError(f"{where}: field 'instruction_id_list[{n}]': unknown instruction '{iid}' (known: "
                             f"{', '.join(sorted(INSTRUCTIONS))}; or read the file with unknown='skip')")
        if kw is not None and not isinstance(kw, dict):
            raise SuiteError(f"{where}: field 'kwargs[{n}]': expected an object, got {type(kw).__name__}")
        try:
            out.append((iid, clean_kwargs(iid, kw)))
        except ValueError as e:
            name, _, msg = str(e).partition(": ")
            raise SuiteError(f"{where}: field 'kwargs[{n}].{name}': {msg}") from None
    if not out:
        return None
    return InstructionItem(str(key), prompt, tuple(out))


def shipped_instructions() -> Suite:
    """The `instructions` suite: evalkit's own prompts."""
    text = resources.files("evalkit.suites").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    items: list[Item] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        # unknown instructions are errors: a shipped row always yields an item (a test keeps it so)
        if line.strip() and (item := parse_ifeval_row(json.loads(line), f"{DATA_FILE}:{lineno}")) is not None:
            items.append(item)
    return Suite("instructions", items)
