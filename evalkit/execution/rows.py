"""One ledger row per attempt: what was asked (without the messages, which live in `cases`),
what came back, when it was due and sent, which clock timed it, and where it came from (a
conversation's turn, a trace's row)."""

from __future__ import annotations

from typing import Any

from ..ledger import dumps
from ..measure.client import RequestResult
from ..redact import redact
from ..spec.dataset import TRACE_FIELDS
from .load import WorkItem


def request_row(run_id: str, item: WorkItem, seq: int, attempt: int, final: bool,
                payload: dict[str, Any], r: RequestResult, scheduled_ms: float | None = None) -> dict[str, Any]:
    body = {k: v for k, v in payload.items() if k != "messages"}  # messages live in `cases`
    wait = (r.mono_start_ms - scheduled_ms) if scheduled_ms is not None and r.mono_start_ms is not None else None
    return {
        "run_id": run_id, "variant": item.variant, "case_id": item.case.id, "repeat": item.repeat,
        "seq": seq, "is_warmup": int(item.warmup), "level": item.level, "concurrency": item.concurrency,
        "replica": item.replica, "attempt": attempt, "final": int(final), "started_at": r.started_at,
        "mono_start_ms": r.mono_start_ms, "scheduled_ms": scheduled_ms, "sent_ms": r.mono_start_ms,
        "client_wait_ms": wait,
        "ttft_from_schedule_ms": r.ttft_ms + wait if r.ttft_ms is not None and wait is not None else None,
        "first_chunk_ms": r.first_chunk_ms, "ttft_ms": r.ttft_ms,
        "e2e_ms": r.e2e_ms, "itl_mean_ms": r.itl_mean_ms, "tpot_ms": r.tpot_ms,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "usage_source": r.usage_source, "finish_reason": r.finish_reason, "text": r.text,
        "n_chunks": r.n_chunks, "n_malformed": r.n_malformed,
        "chunk_offsets_ms_json": dumps([round(x, 3) for x in r.chunk_offsets_ms]),
        "http_status": r.http_status, "error_class": r.error_class, "error": redact(r.error),
        "request_json": redact(dumps(body)), "timestamp_source": r.timestamp_source, "ttft_user_ms": r.ttft_user_ms,
        "e2e_user_ms": r.e2e_user_ms,
        "n_reads": r.n_reads, "first_read_chunks": r.first_read_chunks, "max_read_chunks": r.max_read_chunks,
        "cached_prompt_tokens": r.cached_prompt_tokens,
        "order_block": item.order_block, "order_position": item.order_position,
        "ttfo_ms": r.ttfo_ms, "reasoning_ms": r.reasoning_ms, "reasoning_tokens": r.reasoning_tokens,
        "reasoning_text": r.reasoning or None,
        **{k: item.case.meta.get(k) for k in TRACE_FIELDS if k in item.case.meta},
    }


def timing_suspect(row: dict[str, Any], lag_ms: float | None, threshold_ms: float) -> bool:
    """A row whose client-side timing the client's own load may have bent: the loop lagged past the
    threshold during it, and either its stamps were user space, or (kernel stamps) its first token
    shares its receive time with later chunks, which TCP merges when the client does not read."""
    if row["error_class"] is not None and row["ttft_ms"] is None:
        return False
    if lag_ms is None or lag_ms <= threshold_ms:
        return False
    return row["timestamp_source"] != "kernel" or (row["first_read_chunks"] or 1) > 1
