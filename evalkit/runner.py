"""Run a matrix: for each variant, serve it (or use its endpoint), send every case, write each
result to the ledger the moment it arrives (a crash loses at most the request in flight)."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from sqlite_utils import Database

from . import __version__
from .client import RequestResult, build_payload, stream_chat
from .dataset import Case, dataset_hash
from .engines.bundled import resolve_model
from .engines.vllm_server import VLLMServer, engine_version, server_info, tail
from .errors import EndpointError, EngineError
from .ledger import dumps, utcnow
from .matrix import Matrix, Variant
from .paths import cache_dir
from .redact import redact, redact_args
from .schemas import load_schema


class Reporter(Protocol):
    def message(self, text: str) -> None: ...
    def variant_start(self, variant: str, total: int) -> None: ...
    def request_done(self, variant: str, case: Case, result: RequestResult) -> None: ...
    def variant_end(self, variant: str) -> None: ...


class SilentReporter:
    def message(self, text: str) -> None:
        pass

    def variant_start(self, variant: str, total: int) -> None:
        pass

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        pass

    def variant_end(self, variant: str) -> None:
        pass


@dataclass
class RunSummary:
    run_id: str
    n_requests: int = 0
    n_errors: int = 0
    failed_variants: dict[str, str] = field(default_factory=dict)


def new_run_id() -> str:
    return utcnow()[:10].replace("-", "") + "-" + uuid.uuid4().hex[:8]


def record_cases(db: Database, cases: list[Case], dhash: str) -> None:
    db["cases"].upsert_all(
        [
            {
                "id": c.id, "dataset_hash": dhash, "task": c.task, "persona": c.persona,
                "candidate": c.candidate, "complexity": c.complexity, "formality": c.formality,
                "schema_name": c.schema_name, "context_keys_json": dumps(c.context_keys.model_dump()),
                "messages_json": dumps([m.model_dump() for m in c.messages]),
            }
            for c in cases
        ],
        pk=("dataset_hash", "id"),
    )


def create_run(db: Database, matrix: Matrix, cases: list[Case], dataset_path: Path, seed: int) -> str:
    run_id = new_run_id()
    dhash = dataset_hash(dataset_path)
    record_cases(db, cases, dhash)
    db["runs"].insert(
        {
            "id": run_id, "created_at": utcnow(), "finished_at": None, "status": "running",
            "matrix_name": matrix.name, "matrix_json": redact(matrix.model_dump_json()),
            "dataset_path": str(dataset_path), "dataset_hash": dhash, "n_cases": len(cases),
            "case_ids_json": dumps([c.id for c in cases]), "seed": seed,
            "evalkit_version": __version__, "python_version": platform.python_version(),
            "host": socket.gethostname(), "platform": platform.platform(),
            "argv": " ".join(redact_args(sys.argv)),
        }
    )
    return run_id


def _auth_headers(variant: Variant) -> dict[str, str]:
    if not variant.api_key_env:
        return {}
    key = os.environ.get(variant.api_key_env)
    if not key:
        raise EndpointError(f"variant '{variant.name}': environment variable {variant.api_key_env} is not set")
    return {"Authorization": f"Bearer {key}"}


def request_row(run_id: str, variant: str, case: Case, repeat: int, seq: int, warmup: bool,
                payload: dict[str, Any], r: RequestResult) -> dict[str, Any]:
    body = {k: v for k, v in payload.items() if k != "messages"}  # messages live in `cases`
    return {
        "run_id": run_id, "variant": variant, "case_id": case.id, "repeat": repeat, "seq": seq,
        "is_warmup": int(warmup), "started_at": r.started_at, "ttft_ms": r.ttft_ms,
        "e2e_ms": r.e2e_ms, "itl_mean_ms": r.itl_mean_ms, "tpot_ms": r.tpot_ms,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "usage_source": r.usage_source, "finish_reason": r.finish_reason, "text": r.text,
        "n_chunks": r.n_chunks, "chunk_offsets_ms_json": dumps([round(x, 3) for x in r.chunk_offsets_ms]),
        "http_status": r.http_status, "error_class": r.error_class, "error": redact(r.error),
        "request_json": redact(dumps(body)),
    }


async def _send_cases(
    db: Database, run_id: str, matrix: Matrix, variant: Variant, base_url: str, model: str,
    cases: list[Case], repeats: int, headers: dict[str, str], reporter: Reporter,
) -> tuple[int, int]:
    gen = matrix.generation
    url = f"{base_url}/v1/chat/completions"
    plan: list[tuple[Case, int, bool]] = [(cases[i % len(cases)], 0, True) for i in range(gen.warmup)]
    plan += [(c, rep, False) for rep in range(repeats) for c in cases]
    n = n_err = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for seq, (case, rep, warm) in enumerate(plan):
            schema = load_schema(case.schema_name) if gen.structured_output else None
            payload = build_payload(
                model, [m.model_dump() for m in case.messages], max_tokens=gen.max_tokens,
                temperature=gen.temperature, seed=gen.seed + rep, top_p=gen.top_p,
                schema_name=case.schema_name, schema=schema, extra_body=gen.extra_body,
            )
            result = await stream_chat(session, url, payload, headers=headers, timeout_s=gen.timeout_s)
            db["requests"].insert(request_row(run_id, variant.name, case, rep, seq, warm, payload, result))
            if not warm:
                n += 1
                n_err += 0 if result.ok else 1
            reporter.request_done(variant.name, case, result)
    return n, n_err


def _check_endpoint(base_url: str, headers: dict[str, str]) -> None:
    info = server_info(base_url, headers)
    if not info:
        raise EndpointError(f"endpoint {base_url} is unreachable (no answer on /v1/models or /version)")


def run_variant(
    db: Database, run_id: str, matrix: Matrix, variant: Variant, cases: list[Case], *,
    repeats: int, reporter: Reporter, log_dir: Path,
) -> tuple[int, int]:
    vid = f"{run_id}:{variant.name}"
    db["variants"].insert({
        "id": vid, "run_id": run_id, "name": variant.name,
        "is_baseline": int(variant.name == matrix.baseline), "model": variant.model,
        "engine": variant.engine if variant.launched else "endpoint",
        "server_args_json": dumps(redact_args(variant.vllm_args)),
        "endpoint_url": redact(variant.endpoint), "status": "starting", "started_at": utcnow(),
    })
    headers = _auth_headers(variant)
    server: VLLMServer | None = None
    try:
        if variant.launched:
            assert variant.model is not None
            model_path = resolve_model(variant.model, say=reporter.message)
            served = variant.served_model_name or variant.name
            log_path = log_dir / f"{run_id}-{variant.name}.log"
            server = VLLMServer(
                model_path, served, variant.vllm_args, log_path, env=variant.env,
                cache_dir=cache_dir(), startup_timeout_s=variant.startup_timeout_s,
            )
            reporter.message(f"starting vLLM for '{variant.name}' ({variant.model}); log: {log_path}")
            server.__enter__()
            base_url = server.base_url
            reporter.message(f"'{variant.name}' ready in {server.ready_s:.0f} s at {base_url}")
            db["variants"].update(vid, {
                "model_path": model_path, "served_model_name": served, "ready_s": server.ready_s,
                "engine_version": engine_version(),
                "server_args_json": dumps(server.recorded_args()),
            })
        else:
            base_url = variant.endpoint or ""
            _check_endpoint(base_url, headers)
            served = variant.served_model_name or _first_model(base_url, headers) or variant.name
            db["variants"].update(vid, {"served_model_name": served, "ready_s": 0.0})
        info = server_info(base_url, headers)
        if "version" in info:
            db["variants"].update(vid, {"engine_version": f"{engine_version() if variant.launched else 'remote'} "
                                                          f"(server /version: {info['version'].get('version')})"})
        db["variants"].update(vid, {"status": "running"})
        reporter.variant_start(variant.name, matrix.generation.warmup + repeats * len(cases))
        n, n_err = asyncio.run(_send_cases(db, run_id, matrix, variant, base_url, served, cases,
                                           repeats, headers, reporter))
        reporter.variant_end(variant.name)
        db["variants"].update(vid, {"status": "complete"})
        return n, n_err
    except EngineError as e:
        db["variants"].update(vid, {
            "status": "failed", "error": redact(str(e)),
            "log_tail": redact(tail(server.log_path)) if server else None,
        })
        raise
    except BaseException:
        db["variants"].update(vid, {"status": "interrupted"})
        raise
    finally:
        if server is not None:
            server.stop()
            db["variants"].update(vid, {"stopped_at": utcnow(), "log_tail": redact(tail(server.log_path))})


def _first_model(base_url: str, headers: dict[str, str]) -> str | None:
    data = server_info(base_url, headers).get("models", {}).get("data") or []
    return data[0].get("id") if data else None


def run_matrix(
    db: Database, matrix: Matrix, cases: list[Case], dataset_path: Path, *,
    repeats: int = 1, seed: int = 0, reporter: Reporter | None = None,
    log_dir: Path | None = None, after_variant: Callable[[str], None] | None = None,
) -> RunSummary:
    reporter = reporter or SilentReporter()
    log_dir = log_dir or cache_dir() / "logs"
    run_id = create_run(db, matrix, cases, dataset_path, seed)
    summary = RunSummary(run_id)
    reporter.message(f"run {run_id}: {len(matrix.variants)} variants x {len(cases)} cases x {repeats} repeats")
    status = "interrupted"
    try:
        for variant in matrix.ordered_variants():
            try:
                n, n_err = run_variant(db, run_id, matrix, variant, cases, repeats=repeats,
                                       reporter=reporter, log_dir=log_dir)
                summary.n_requests += n
                summary.n_errors += n_err
            except EngineError as e:
                summary.failed_variants[variant.name] = str(e).splitlines()[0]
                reporter.message(f"variant '{variant.name}' failed: {str(e).splitlines()[0]}")
            if after_variant:
                after_variant(variant.name)
        status = "failed" if len(summary.failed_variants) == len(matrix.variants) else "complete"
    finally:
        db["runs"].update(run_id, {"status": status, "finished_at": utcnow()})
    return summary
