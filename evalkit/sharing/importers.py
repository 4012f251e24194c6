"""Other load tools' per-request results in the ledger: `evalkit import TOOL FILE`. Each request
becomes a row of a run marked with its `source` (or a variant added to an existing run, `--into`),
so `report`, the HTML report and Datasette put it beside evalkit's own runs. A field a tool does
not record stays empty, never invented, and each tool's definitions are mapped onto evalkit's
(docs/measuring.md, "Other tools' definitions"):

- GuideLLM (benchmark JSON, `--output kind=json`): `time_to_first_token_ms`; its
  `inter_token_latency_ms` is (E2E − TTFT)/(tokens − 1), evalkit's TPOT; its
  `time_per_output_token_ms` is E2E/tokens (no evalkit column); no per-chunk times.
- AIPerf (`profile_export.jsonl`): `time_to_first_token`, `request_latency`; its
  `inter_token_latency` is evalkit's TPOT; `inter_chunk_latency` gives the chunk gaps.
- `vllm bench serve --save-result --save-detailed`: `ttfts`, `itls` (chunk gaps), `latencies`;
  with its `openai-chat` backend TTFT ends at the first chunk of any kind (vLLM's role-only first
  chunk), which evalkit calls `first_chunk_ms`, not TTFT.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UsageError
from ..ledger import Ledger, dumps, utcnow
from ..spec.config import read_text
from ..stats import mean

TOOLS = ("guidellm", "aiperf", "vllm-bench")


class ResultFileError(UsageError):
    """A file that is not what the named tool writes (names the file and what was expected)."""


def _iso(epoch_s: float | None) -> str | None:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat(timespec="milliseconds") if epoch_s else None


def _row(i: int, **kw: Any) -> dict[str, Any]:
    base = {"case_id": f"import-{i:06d}", "repeat": 0, "is_warmup": 0, "level": "main", "concurrency": None,
            "attempt": 0, "final": 1, "timestamp_source": "imported"}
    return {**base, **kw}


def guidellm(path: Path, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    try:
        d = json.loads(text)
        benches = d["benchmarks"]
        version = d.get("metadata", {}).get("guidellm_version")
    except (ValueError, KeyError, TypeError):
        raise ResultFileError(f"{path}: not a GuideLLM benchmark JSON (expected `benchmarks` and `metadata`)") from None
    rows, t0 = [], None
    for b in benches:
        reqs = b.get("requests") or {}
        for status in ("successful", "errored", "incomplete"):
            for r in reqs.get(status) or []:
                start = r.get("request_start_time") or (r.get("info") or {}).get("started_at")
                t0 = t0 if t0 is not None else start
                err = (r.get("info") or {}).get("error")
                rows.append(_row(
                    len(rows), started_at=_iso(start), mono_start_ms=(start - t0) * 1000 if start and t0 else None,
                    sent_ms=(start - t0) * 1000 if start and t0 else None, ttft_ms=r.get("time_to_first_token_ms"),
                    e2e_ms=r["request_latency"] * 1000 if r.get("request_latency") is not None else None,
                    tpot_ms=r.get("inter_token_latency_ms"), prompt_tokens=r.get("prompt_tokens"),
                    completion_tokens=r.get("output_tokens"), usage_source="guidellm", text=r.get("output"),
                    error_class=None if status == "successful" else f"import_{status}",
                    error=str(err)[:2000] if err else (None if status == "successful" else status),
                    concurrency=((b.get("config") or {}).get("strategy") or {}).get("max_concurrency"),
                    level=((b.get("config") or {}).get("strategy") or {}).get("type_", "main")))
    if not rows:
        raise ResultFileError(f"{path}: a GuideLLM file with no requests")
    return rows, {"tool_version": version, "model": _guidellm_model(d)}


def _guidellm_model(d: dict[str, Any]) -> str | None:
    for b in d.get("benchmarks") or []:
        for r in (b.get("requests") or {}).get("successful") or []:
            try:
                return json.loads(r["request_args"])["body"]["model"]
            except (KeyError, TypeError, ValueError):
                return None
    return None


def aiperf(path: Path, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, t0 = [], None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            meta, m = d["metadata"], d["metrics"]
            if not isinstance(m, dict) or "request_start_ns" not in meta:
                raise KeyError("metrics")
        except (ValueError, KeyError, TypeError):
            raise ResultFileError(f"{path}:{n}: not an AIPerf profile_export.jsonl record (expected `metadata` and "
                               "`metrics`)") from None
        if meta.get("benchmark_phase") not in (None, "profiling"):
            continue  # warm-up records

        def v(name: str, m: dict[str, Any] = m) -> Any:
            x = m.get(name)
            return x.get("value") if isinstance(x, dict) else x

        start = meta.get("request_start_ns")
        t0 = t0 if t0 is not None else start
        gaps = v("inter_chunk_latency")
        ttft = v("time_to_first_token")
        offsets = [ttft + sum(gaps[:k]) for k in range(len(gaps) + 1)] if ttft is not None and isinstance(gaps, list) \
            else None
        err = d.get("error")
        rows.append(_row(
            len(rows), started_at=_iso(start / 1e9 if start else None),
            mono_start_ms=(start - t0) / 1e6 if start and t0 else None, sent_ms=(start - t0) / 1e6 if start and t0 else None,
            ttft_ms=ttft, e2e_ms=v("request_latency"), tpot_ms=v("inter_token_latency"),
            itl_mean_ms=mean(gaps) if isinstance(gaps, list) and gaps else None,
            chunk_offsets_ms_json=dumps([round(x, 3) for x in offsets]) if offsets else None,
            prompt_tokens=v("usage_prompt_tokens") or v("input_sequence_length"),
            completion_tokens=v("usage_completion_tokens") or v("output_sequence_length"), usage_source="aiperf",
            error_class="import_error" if err else None, error=json.dumps(err)[:2000] if err else None))
    if not rows:
        raise ResultFileError(f"{path}: an AIPerf export with no profiling records")
    return rows, {"tool_version": None, "model": None}


def vllm_bench(path: Path, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    try:
        d = json.loads(text)
        n = len(d["ttfts"])
        lists = {k: d[k] for k in ("ttfts", "itls", "latencies", "input_lens", "output_lens")}
    except (ValueError, KeyError, TypeError):
        raise ResultFileError(f"{path}: not a `vllm bench serve --save-result --save-detailed` file (expected per-request "
                           "`ttfts`, `itls`, `latencies`, `input_lens`, `output_lens`)") from None
    starts = d.get("start_times") or [None] * n
    texts = d.get("generated_texts") or [None] * n
    errors = d.get("errors") or [""] * n
    t0 = next((s for s in starts if s is not None), None)
    rows = []
    for i in range(n):
        ttft, lat, itls = lists["ttfts"][i], lists["latencies"][i], lists["itls"][i] or []
        out = lists["output_lens"][i]
        ok = not errors[i]
        # bench serve's openai-chat TTFT ends at the first chunk of any kind: evalkit's first_chunk_ms
        chat = d.get("backend") == "openai-chat"
        offsets = [ttft * 1000 + sum(itls[:k]) * 1000 for k in range(len(itls) + 1)] if ok else []
        rows.append(_row(
            i, started_at=None, mono_start_ms=(starts[i] - t0) * 1000 if starts[i] is not None and t0 is not None else None,
            sent_ms=(starts[i] - t0) * 1000 if starts[i] is not None and t0 is not None else None,
            first_chunk_ms=ttft * 1000 if ok else None, ttft_ms=None if chat or not ok else ttft * 1000,
            e2e_ms=lat * 1000 if ok else None,
            tpot_ms=(lat - ttft) * 1000 / (out - 1) if ok and out and out > 1 else None,
            itl_mean_ms=mean([x * 1000 for x in itls]) if ok and itls else None,
            chunk_offsets_ms_json=dumps([round(x, 3) for x in offsets]) if offsets else None,
            prompt_tokens=lists["input_lens"][i], completion_tokens=out if ok else None, usage_source="vllm-bench",
            text=texts[i], error_class=None if ok else "import_error", error=errors[i] or None))
    return rows, {"tool_version": d.get("date"), "model": d.get("model_id"), "rate": d.get("request_rate"),
                  "max_concurrency": d.get("max_concurrency")}


READERS = {"guidellm": guidellm, "aiperf": aiperf, "vllm-bench": vllm_bench}


def import_results(ledger: Ledger, tool: str, path: Path, into: str | None = None, name: str | None = None) -> str:
    """Read a tool's per-request results into a new run (or, with ``into``, as a variant of an
    existing run); returns the run id."""
    if tool not in READERS:
        raise UsageError(f"import: unknown tool '{tool}' (known: {', '.join(TOOLS)})")
    text = read_text(path, ResultFileError, f"{tool} result")
    rows, info = READERS[tool](path, text)
    for r in rows:  # each import's cases are its own: two imports into one run never pair up
        r["case_id"] = f"{tool}-{r['case_id'][len('import-'):]}"
    variant = name or f"{tool}:{info.get('model') or 'model'}"
    dhash = hashlib.sha256(text.encode()).hexdigest()
    cases = [{"id": r["case_id"], "dataset_hash": dhash, "task": "trace", "persona": "import", "candidate": "import",
              "complexity": _complexity(r.get("prompt_tokens")), "formality": 3, "schema_name": "outreach_email",
              "context_keys_json": "{}", "messages_json": "[]"} for r in rows]
    if into:
        run = ledger.require_run(into, what="import --into: ")
        if ledger.has_variant(f"{into}:{variant}"):
            raise UsageError(f"import --into {into}: the run already has a variant '{variant}' (name it with --as)")
        run_id = into
        ledger.record_cases([{**c, "dataset_hash": run["dataset_hash"]} for c in cases])
    else:
        run_id = utcnow()[:10].replace("-", "") + "-" + uuid.uuid4().hex[:8]
        ledger.record_cases(cases)
        ledger.create_run({
            "id": run_id, "created_at": utcnow(), "finished_at": utcnow(), "status": "complete",
            "matrix_name": f"import:{tool}", "matrix_json": dumps({"name": f"import:{tool}", "baseline": variant,
                                                                   "generation": {"max_tokens": max(
                                                                       (r.get("completion_tokens") or 0 for r in rows),
                                                                       default=0)}, "variants": []}),
            "dataset_path": str(path), "dataset_hash": dhash, "n_cases": len(rows),
            "case_ids_json": dumps([r["case_id"] for r in rows]), "seed": 0, "evalkit_version": __version__,
            "source": tool, "load_json": dumps({"mode": "imported", "rate": info.get("rate")}),
        })
    ledger.upsert_variant({"id": f"{run_id}:{variant}", "run_id": run_id, "name": variant,
                           "is_baseline": 0 if into else 1, "model": info.get("model"), "engine": f"import:{tool}",
                           "engine_version": f"{tool} {info.get('tool_version') or ''}".strip(), "status": "complete",
                           "endpoint_url": None})
    seq = ledger.max_seq(run_id)
    with ledger.transaction():
        for k, r in enumerate(rows, start=1):
            ledger.insert_request({**r, "run_id": run_id, "variant": variant, "seq": seq + k})
    return run_id


def _complexity(prompt_tokens: int | None) -> str:
    n = prompt_tokens or 0
    return "short" if n < 400 else "medium" if n < 1000 else "long"
