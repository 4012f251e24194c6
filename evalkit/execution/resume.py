"""Finishing a run later: its state (a `running` run whose process is gone is stale), everything
needed to continue exactly as it started, and sending failed requests again (`--retry-failed`)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..ledger import Ledger, RunRecord
from ..spec.dataset import Case, dataset_hash
from ..spec.matrix import Matrix
from .error_classes import DEFAULT_RETRY_CLASSES
from .load import Load

KNOWN_CLASSES = (*DEFAULT_RETRY_CLASSES, "malformed_stream", "empty_completion", "interrupted", "http_4xx")


def parse_retry_classes(text: str) -> list[str]:
    """`connect_error,stream_cut` -> the classes; http_5xx / http_4xx stand for their families;
    a single status (http_503) is taken as written."""
    out = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in out if c not in KNOWN_CLASSES and not (c.startswith("http_") and c[5:].isdigit())]
    if bad or not out:
        raise UsageError(f"--retry-failed: unknown error class(es) {', '.join(bad) or '(none)'} "
                         f"(known: {', '.join(KNOWN_CLASSES)}, or a status like http_503)")
    return out


def refuse_resume_options(**given: object) -> None:
    """--resume takes everything from the original run: any other run option is a usage error."""
    named = [k.replace("_", "-") for k, v in given.items() if v]
    if named:
        raise UsageError("--resume takes the matrix, dataset, cases and load of the original run: drop "
                         + ", ".join(f"--{n}" for n in named))


@dataclass
class ResumeContext:
    matrix: Matrix
    cases: Sequence[Case]
    dataset_path: Path
    load: Load
    repeats: int


def run_state(run: dict) -> str:
    """A run's status as it really is: `running` only while its process lives (on this host; on
    another host it cannot be told), `running (stale: ...)` when that process is gone."""
    status = run.get("status") or "unknown"
    if status != "running" or not run.get("pid"):
        return status
    if run.get("host") and run["host"] != socket.gethostname():
        return f"running (on host {run['host']}, process {run['pid']})"
    try:
        os.kill(int(run["pid"]), 0)
    except ProcessLookupError:
        return f"running (stale: its process {run['pid']} is gone; `evalkit run --resume {run['id']}` finishes it)"
    except PermissionError:
        pass
    return "running"


def resume_context(ledger: Ledger, run_id: str) -> ResumeContext:
    """Everything needed to finish a run exactly as it was started."""
    run = ledger.require_run(run_id, what="--resume: ")
    if run_state(run) == "running" and run.get("pid") != os.getpid():
        raise UsageError(f"--resume: run {run_id} is still running (process {run['pid']}); stop it first")
    dpath = Path(run["dataset_path"])
    if dataset_hash(dpath) != run["dataset_hash"]:
        raise UsageError(f"--resume: {dpath} changed since run {run_id} started (hash differs)")
    try:
        matrix = Matrix.model_validate(stored_matrix(run["matrix_json"]))
        if run.get("workload_dir") and Path(run["workload_dir"]).is_dir():
            matrix._folder = Path(run["workload_dir"])
    except ValueError as e:
        raise UsageError(f"--resume: run {run_id}'s matrix does not load in this evalkit version "
                         f"({str(e).splitlines()[0]})") from None
    if run.get("trace_json"):  # a trace replay: the same cases and schedule, built again from the trace
        from .traces import TraceSpec, trace_cases

        spec = dict(run.trace or {})
        spec.pop("tokenizer", None)
        cases, offsets, _ = trace_cases(TraceSpec(**spec), matrix)
        if len(cases) != len(run.case_ids):  # kept on disk in trace order, as the run recorded them
            raise UsageError(f"--resume: run {run_id}'s trace {spec.get('path')} now has {len(cases)} rows, "
                             f"the run recorded {len(run.case_ids)}")
        return ResumeContext(matrix, cases, dpath, *load_of_run(run, offsets))
    all_cases = matrix.load_cases(dpath)
    by_id = {c.id: c for c in all_cases}
    return ResumeContext(matrix, [by_id[i] for i in run.case_ids], dpath, *load_of_run(run, None))


ENDPOINT_FIELDS = ("endpoint", "endpoints", "api_key_env")  # what may change on --resume: where and with what key


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """`generation.max_tokens` -> value; variants keyed by name (`variants.cand.endpoint`); lists whole."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if prefix == "variants." and isinstance(d, list):
        return _flat({v.get("name"): v for v in d}, prefix)
    return {prefix.rstrip("."): d}


def endpoint_changes(run_id: str, stored: Matrix, given: Matrix) -> list[str]:
    """`--resume` with a matrix: it may differ from the run's only in endpoints (URLs, key variable
    names; the judge's too), which are taken into ``stored``; returns one line per change
    (`resume: cand endpoint http://a → http://b`). Any other difference is one line naming the
    field. What the run set aside itself (the baseline's noise-floor pass, teacher-forced scoring,
    when its graders did not read them) is not a difference."""
    from ..redact import redact

    mine = given.model_copy(deep=True)
    if stored.generation.baseline_repeats == 1:
        mine.generation.baseline_repeats = 1
    if not stored.divergence.enabled:
        mine.divergence.enabled = False
    old, new = (_flat(json.loads(redact(m.model_dump_json()) or "{}")) for m in (stored, mine))
    if [v.name for v in stored.variants] != [v.name for v in given.variants]:
        raise UsageError(f"--resume: the matrix's variants ({', '.join(v.name for v in given.variants)}) are not run "
                         f"{run_id}'s ({', '.join(v.name for v in stored.variants)}): only endpoints may change")
    lines = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        owner, _, leaf = key.rpartition(".")
        if leaf not in ENDPOINT_FIELDS or not (owner.startswith("variants.") or owner == "judge"):
            raise UsageError(f"--resume: the matrix differs from run {run_id}'s in field '{key}' ({a!r} → {b!r}): "
                             "only endpoints (URLs, api_key_env) may change; drop --matrix/--workload to resume as "
                             "it was")
        lines.append(f"resume: {owner.removeprefix('variants.')} {leaf.replace('_', ' ')} {a} → {b}")
    for v in stored.variants:
        g = given.variant(v.name)
        v.endpoint, v.endpoints, v.api_key_env = g.endpoint, g.endpoints, g.api_key_env
    if stored.judge is not None and given.judge is not None:
        stored.judge.endpoint, stored.judge.api_key_env = given.judge.endpoint, given.judge.api_key_env
    return lines


def stored_matrix(text: str) -> dict:
    """A run's stored matrix as this evalkit reads it: a ledger written by evalkit 0.1 stored the
    sampling seed as `generation.seed`."""
    m = json.loads(text)
    gen = m.get("generation") or {}
    if "seed" in gen:
        gen["sampling_seed"] = gen.pop("seed")
    return m


def load_of_run(run: RunRecord, trace_offsets: list[float] | None = None) -> tuple[Load, int]:
    """The load a run was started with (and its repeats), from its stored record; a trace's
    arrival offsets are built again from the trace."""
    return Load.from_record(run.load, trace_offsets), run.repeats
