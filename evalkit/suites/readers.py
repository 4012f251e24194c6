"""The user's own copies of standard sets, read in their published field layouts (docs/suites.md
lists every field): `gsm8k:FILE`, `mmlu:FILE`, `arc:FILE`, `ifeval:FILE`.

Formats by extension: `.csv` (MMLU's original release: no header), `.jsonl` and `.parquet` (read
with pyarrow, imported only then). `mmlu:` and `arc:` also take a folder: every csv/jsonl/parquet
file directly in it, in name order. A bad file or row is one SuiteError naming `file:line` (a
parquet file's row number) and the field; nothing here prints or exits.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import SuiteError
from ..spec.config import json_rows, read_text
from .choice import hf_choice_row
from .extract import reference_number
from .instructions import Unknown, parse_ifeval_row
from .items import ChoiceItem, Item, NumericItem, Suite

FORMATS = (".csv", ".jsonl", ".parquet")
LETTERS = "ABCDEFGHIJ"


def files(path: Path, allow_folder: bool) -> list[Path]:
    """The file, or with ``allow_folder`` every file of a known format directly in the folder."""
    if path.is_dir():
        if not allow_folder:
            raise SuiteError(f"{path}: a folder; give one file")
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)
        if not found:
            raise SuiteError(f"{path}: no {', '.join(FORMATS)} files in this folder")
        return found
    if not path.exists():
        raise SuiteError(f"{path}: file not found")
    return [path]


def _suffix(path: Path, allowed: tuple[str, ...], layout: str) -> str:
    suf = path.suffix.lower()
    if suf not in allowed:
        raise SuiteError(f"{path}: {layout} is read from {' or '.join(s.lstrip('.') for s in allowed)} files, not "
                         f"'{suf or 'no extension'}'")
    return suf


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line or row number, object) for a jsonl or parquet file."""
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq  # lazy: pyarrow is heavy and only parquet needs it
        except ImportError:
            raise SuiteError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any pyarrow failure is one line about the file
            raise SuiteError(f"{path}: not a readable parquet file ({str(e).splitlines()[0][:200]})") from None
        yield from enumerate(table.to_pylist(), start=1)
        return
    yield from json_rows(path, read_text(path, SuiteError, "suite"), SuiteError)


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields) for a csv file; blank lines skipped."""
    text = read_text(path, SuiteError, "suite").lstrip("\ufeff")
    reader = csv.reader(io.StringIO(text))
    start = 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise SuiteError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None
        if any(f.strip() for f in fields):
            yield start, fields
        start = reader.line_num + 1


def _str(row: dict[str, Any], key: str, where: str) -> str:
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise SuiteError(f"{where}: field '{key}': " + ("missing" if v is None else "expected a non-empty string"))
    return v


def read_gsm8k(path: Path) -> Suite:
    """GSM8K jsonl (or parquet): `question`, and `answer` whose last line is `#### N`."""
    items: list[Item] = []
    wheres: list[str] = []  # each item's file:line, for a duplicate's message
    for p in files(path, False):
        _suffix(p, (".jsonl", ".parquet"), "GSM8K")
        for n, row in records(p):
            where = f"{p}:{n}"
            q, a = _str(row, "question", where), _str(row, "answer", where)
            ref = reference_number(a)
            if ref is None:
                raise SuiteError(f"{where}: field 'answer': no final '#### <number>' line (the GSM8K layout ends "
                                 "every answer with one)")
            items.append(NumericItem(f"{p.stem}-{n}", q, ref, p.stem, f"{p.stem}-{n}"))
            wheres.append(where)
    return _suite("gsm8k", items, wheres, path)


def mmlu_subject(path: Path) -> str:
    """`abstract_algebra_test.csv` -> abstract_algebra (the original release names files so)."""
    stem = path.stem
    for suffix in ("_test", "_val", "_dev"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def read_mmlu(path: Path) -> Suite:
    """MMLU: the original csv (no header: question, A, B, C, D, answer letter; the subject from the
    file name), or the Hugging Face layout in jsonl/parquet (`question`, `subject`, `choices`,
    `answer` 0-3)."""
    items: list[Item] = []
    wheres: list[str] = []  # each item's file:line, for a duplicate's message
    for p in files(path, True):
        if _suffix(p, FORMATS, "MMLU") == ".csv":
            subject = mmlu_subject(p)
            for line, f in csv_rows(p):
                where = f"{p}:{line}"
                if len(f) != 6:
                    raise SuiteError(f"{where}: field '(row)': expected 6 columns (question, A, B, C, D, answer), "
                                     f"got {len(f)}")
                for name, value in zip(("question", "A", "B", "C", "D"), f[:5], strict=True):
                    if not value.strip():
                        raise SuiteError(f"{where}: field '{name}': empty")
                ans = f[5].strip().upper()
                if ans not in ("A", "B", "C", "D"):
                    raise SuiteError(f"{where}: field 'answer': expected A, B, C or D, got {f[5]!r}")
                items.append(ChoiceItem(f"{p.stem}-{line}", f[0], tuple(f[1:5]), "ABCD".index(ans), subject, subject))
                wheres.append(where)
        else:
            for n, row in records(p):
                items.append(hf_choice_row(row, f"{p}:{n}", f"{p.stem}-{n}"))
                wheres.append(f"{p}:{n}")
    return _suite("mmlu", items, wheres, path)


def arc_category(path: Path) -> str:
    """challenge / easy when the path says so (ARC-Challenge-Test.jsonl, ARC-Easy/test.parquet),
    else the file's stem."""
    low = f"{path.parent.name}/{path.name}".lower()  # the file and its folder: not a path's unrelated words
    return "challenge" if "challenge" in low else "easy" if "easy" in low else path.stem


def _arc_item(row: dict[str, Any], where: str, fallback_id: str, category: str) -> ChoiceItem:
    q = row.get("question")
    if isinstance(q, dict):  # AI2's original: question {stem, choices: [{text, label}]}
        stem, choices = q.get("stem"), q.get("choices")
        qfield, cfield = "question.stem", "question.choices"
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise SuiteError(f"{where}: field '{cfield}': expected a list of {{text, label}} objects")
        texts, labels = [c.get("text") for c in choices], [c.get("label") for c in choices]
    else:  # Hugging Face: question, choices {text: [...], label: [...]}
        stem, choices = q, row.get("choices")
        qfield, cfield = "question", "choices"
        if not isinstance(choices, dict):
            raise SuiteError(f"{where}: field 'choices': expected {{text: [...], label: [...]}}")
        texts, labels = list(choices.get("text") or []), list(choices.get("label") or [])
    if not isinstance(stem, str) or not stem.strip():
        raise SuiteError(f"{where}: field '{qfield}': expected a non-empty string")
    if not 2 <= len(texts) <= 10 or not all(isinstance(t, str) and t.strip() for t in texts):
        raise SuiteError(f"{where}: field '{cfield}.text': expected 2-10 non-empty option texts")
    labels = [str(x) if isinstance(x, (str, int)) and not isinstance(x, bool) else None for x in labels]
    if len(labels) != len(texts) or None in labels or len(set(labels)) != len(labels):
        raise SuiteError(f"{where}: field '{cfield}.label': expected one distinct label per option")
    key = row.get("answerKey")
    if str(key) not in labels or isinstance(key, bool) or key is None:
        raise SuiteError(f"{where}: field 'answerKey': {key!r} is not one of the labels {', '.join(labels)}")
    rid = row.get("id")
    item_id = str(rid) if isinstance(rid, (str, int)) and str(rid).strip() else fallback_id
    return ChoiceItem(item_id, stem, tuple(texts), labels.index(str(key)), category, item_id)


def read_arc(path: Path) -> Suite:
    """ARC: the Hugging Face layout (jsonl/parquet: `id`, `question`, `choices: {text, label}`,
    `answerKey`) or AI2's original jsonl (`id`, `question: {stem, choices: [{text, label}]}`,
    `answerKey`). Labels may be letters or digits; options are shown as A, B, C, ... either way."""
    items: list[Item] = []
    wheres: list[str] = []  # each item's file:line, for a duplicate's message
    for p in files(path, True):
        _suffix(p, (".jsonl", ".parquet"), "ARC")
        cat = arc_category(p)
        for n, row in records(p):
            items.append(_arc_item(row, f"{p}:{n}", f"{p.stem}-{n}", cat))
            wheres.append(f"{p}:{n}")
    return _suite("arc", items, wheres, path)


def read_ifeval(path: Path, unknown: Unknown = "error") -> Suite:
    """IFEval's `input_data.jsonl` layout (jsonl/parquet: `key`, `prompt`, `instruction_id_list`,
    `kwargs`), mapped onto evalkit's checkers by instruction id. An unknown id is an error naming
    file:line and the field; with ``unknown`` "skip" it is left out (and a prompt left with no
    instruction), each noted on the suite."""
    items: list[Item] = []
    wheres: list[str] = []  # each item's file:line, for a duplicate's message
    notes: list[str] = []
    for p in files(path, False):
        _suffix(p, (".jsonl", ".parquet"), "IFEval")
        for n, row in records(p):
            if (item := parse_ifeval_row(row, f"{p}:{n}", unknown, notes)) is not None:
                items.append(item)
                wheres.append(f"{p}:{n}")
    suite = _suite("ifeval", items, wheres, path, "key")
    suite.notes = notes
    return suite


def _suite(name: str, items: list[Item], wheres: list[str], path: Path, id_field: str = "id") -> Suite:
    if not items:
        raise SuiteError(f"{path}: no rows")
    seen: dict[str, str] = {}
    for it, where in zip(items, wheres, strict=True):
        if it.id in seen:
            raise SuiteError(f"{where}: field '{id_field}': duplicate id '{it.id}' (first at {seen[it.id]})")
        seen[it.id] = where
    return Suite(name, items, str(path))


READERS = {"gsm8k": read_gsm8k, "mmlu": read_mmlu, "arc": read_arc, "ifeval": read_ifeval}
