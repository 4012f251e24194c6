"""Known answers for the report (issue 48, item 5): `report --json` and `report --html` of a
synthesized run, written once by the report computed from every row in memory (the plain
computation, before it was deleted) and kept in tests/fixtures/golden/. Every number must stay
within 1e-9 (relative or absolute) of the file; every text must stay the same. A change that
moves a number on purpose re-writes the files (``EVALKIT_GOLDEN=write``) and lists the
differences in the CHANGELOG."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
MARGINS = "schema_pass=-2pp,formality_mae=0.3,ttft_mean=+10%,e2e_mean=+5%,schema_flips=10pp"
HTML_MARGINS = "schema_pass=-2pp,ttft_mean=+10%,e2e_mean=+5%"

# What the synthesized run lacks, written into a copy of it: each shape has its own known answer.
SHAPES = {
    "trace": ["update requests set trace_row = (id * 7919) % 1000, scheduled_ms = id * 10.0, sent_ms = id * 10.0 + "
              "(id % 13), trace_input_tokens = prompt_tokens + (id % 3), trace_output_tokens = 100"],
    "conversations": ["update requests set conversation_id = 'conv-' || (id % 40) where id % 5 != 0"],
    "prefix_sharing": ["update requests set designed_shared_tokens = id % 50, cached_prompt_tokens = id % 30"],
    "relative_slo": ["""update runs set load_json = json_set(load_json, '$.slo_relative', json('{"ttft": 3, "e2e": 4}'),
                        '$.slo_ttft_ms', 2000)"""],
    "two_servers": ["update requests set replica = id % 2"],
    "a_label_over_two_levels": ["update requests set level = 'main' where variant = 'w8a8'"],
    "first_level_all_failed": ["update requests set error_class = 'timeout', ttft_ms = null, e2e_ms = null "
                               "where variant = 'fp8' and concurrency = 1",
                               # a failed request is never graded (`graded_requests`)
                               "delete from grades where request_id in (select id from requests where error_class "
                               "is not null)"],
}


def synth() -> Any:
    """benchmarks/synth_ledger.py as a module (benchmarks is no package)."""
    spec = importlib.util.spec_from_file_location("synth_ledger", ROOT / "benchmarks" / "synth_ledger.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def close(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two reports differ beyond 1e-9 (relative or absolute): every number, key and text."""
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (a != a and b != b) else [f"{path}: {a} != {b}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path}: keys {list(a)} != {list(b)}"]
        return [d for k in a for d in close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in close(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def report_json(report: dict[str, Any], findings: dict[str, Any]) -> Any:
    """`report --json`'s document, less what differs between two writes of the same run (when the
    synthesizer wrote it, the version that did)."""
    from evalkit.reporting.report import to_json

    js = json.loads(to_json({**report, "findings": findings}))
    js["run"].update(created_at=None, finished_at=None, evalkit_version=None)
    return js


def html_text(html: str, report: dict[str, Any]) -> str:
    """The HTML report, less when the synthesizer wrote the run."""
    return html.replace(report["run"]["created_at"], "CREATED")


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def same_text(a: str, b: str) -> list[str]:
    """Where two texts differ: their words must be the same, their numbers equal or one unit apart in
    the last digit printed (a chart's coordinate rounded from a float whose last bits another
    processor's arithmetic moved)."""
    wa, wb = _NUMBER.split(a), _NUMBER.split(b)
    if wa != wb:
        at = next(i for i, (x, y) in enumerate(zip(wa, wb, strict=False)) if x != y) if any(
            x != y for x, y in zip(wa, wb, strict=False)) else min(len(wa), len(wb))
        return [f"text {at}: {wa[at][:80] if at < len(wa) else None!r} != {wb[at][:80] if at < len(wb) else None!r}"]
    out = []
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True):
        if x != y:
            unit = 10.0 ** -(len(x.split(".")[1]) if "." in x and "e" not in x else 0)
            if abs(float(x) - float(y)) > unit * 1.0001:
                out.append(f"{x} != {y}")
    return out


def known(name: str, got: Any) -> Any:
    """The known answer ``name`` (JSON, or text for .html), or, under ``EVALKIT_GOLDEN=write``,
    ``got`` written as it."""
    path = GOLDEN / f"{name}.gz"
    if os.environ.get("EVALKIT_GOLDEN") == "write":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        text = got if isinstance(got, str) else json.dumps(got, indent=0, sort_keys=False)
        tmp = path.with_suffix(".gz.tmp")
        with gzip.GzipFile(tmp, "wb", 9, mtime=0) as fh:  # no time in the file: the same answer, the same bytes
            fh.write(text.encode())
        tmp.replace(path)
        return got
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    return text if name.endswith(".html") else json.loads(text)
