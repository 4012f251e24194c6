"""Scoring a given answer on one server, teacher-forced: the request, the HTTP exchange, and the
parsing of vLLM's answer into per-token arrays. Never raises for what a server does: every outcome
comes back as a `ScoreResult` with a status, so each scoring request can be recorded.

The request (vLLM's OpenAI server; docs/measuring.md, "Token-level divergence"): the case's
messages plus the answer as an assistant message, `continue_final_message: true`,
`add_generation_prompt: false`, `max_tokens: 1`, `prompt_logprobs: k` (top-k log-probabilities
at every prompt position) and `return_token_ids: true` (the prompt's token ids). The answer's
tokens are the prompt's last ones: `/tokenize` with the messages alone and the generation prompt
gives where they start (a second chat request with `max_tokens: 1` when a server has no
`/tokenize`). vLLM refuses `prompt_logprobs` with `stream: true` and above `--max-logprobs`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..ledger import utcnow

# statuses a scoring row can have
OK, ERROR, UNSUPPORTED = "ok", "error", "unsupported"


@dataclass
class ScoreResult:
    status: str = ERROR
    started_at: str = field(default_factory=utcnow)
    mono_start_ms: float | None = None
    e2e_ms: float | None = None
    http_status: int | None = None
    error_class: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    server_timing: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    prefix_tokens: int | None = None
    tokens: dict[str, list[Any]] | None = None  # the per-answer-token arrays (`parse_prompt_logprobs`)
    text: str | None = None  # a regeneration's answer
    finish_reason: str | None = None

    @property
    def answer_tokens(self) -> int | None:
        return len(self.tokens["ids"]) if self.tokens else None


def scoring_payload(model: str, messages: list[dict[str, Any]], answer: str, top_k: int) -> dict[str, Any]:
    return {"model": model, "messages": [*messages, {"role": "assistant", "content": answer}], "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": top_k, "continue_final_message": True,
            "add_generation_prompt": False, "return_token_ids": True, "stream": False}


def prefix_payload(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """`/tokenize` of the messages alone with the generation prompt: where the answer begins."""
    return {"model": model, "messages": messages, "add_generation_prompt": True}


async def post_json(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
                    timeout_s: float, epoch: float) -> tuple[ScoreResult, dict[str, Any] | None]:
    """One POST; the result carries timing and any transport or HTTP error, the body when JSON."""
    r = ScoreResult()
    t0 = time.perf_counter()
    r.mono_start_ms = (t0 - epoch) * 1000.0
    try:
        async with http.post(url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            r.http_status = resp.status
            raw = await resp.read()
    except (asyncio.TimeoutError, TimeoutError):
        r.error_class, r.error = "timeout", f"no answer within {timeout_s:g} s"
        return r, None
    except (aiohttp.ClientError, OSError) as e:
        r.error_class, r.error = "connect_error", f"{type(e).__name__}: {e}"[:500]
        return r, None
    finally:
        r.e2e_ms = (time.perf_counter() - t0) * 1000.0
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    if r.http_status is None or r.http_status >= 400:
        msg = ((data or {}).get("error") or {}) if isinstance(data, dict) else {}
        text = msg.get("message") if isinstance(msg, dict) else str(msg)
        r.error_class, r.error = f"http_{r.http_status}", (text or raw[:300].decode("utf-8", "replace"))[:500]
        return r, data if isinstance(data, dict) else None
    if not isinstance(data, dict):
        r.error_class, r.error = "not_json", "the answer is not a JSON object"
        return r, None
    return r, data


def refused_prompt_logprobs(r: ScoreResult) -> bool:
    """A 4xx that names the scoring fields: the server does not do teacher-forced scoring (a hosted
    API), as opposed to a request it could not take this time."""
    if r.http_status is None or not 400 <= r.http_status < 500 or r.http_status == 429:
        return False
    e = (r.error or "").lower()
    return any(x in e for x in ("prompt_logprobs", "continue_final_message", "add_generation_prompt",
                                "unrecognized", "extra inputs", "not permitted", "unknown"))


def parse_prompt_logprobs(data: dict[str, Any], prefix_tokens: int, top_k: int,
                          token_ids: list[int] | None = None) -> tuple[dict[str, list[Any]] | None, str | None]:
    """vLLM's answer -> the answer tokens' arrays, or (None, why not). Per answer token: its id and
    text, its log-probability and rank, and the top-k ids and log-probabilities in rank order."""
    pl = data.get("prompt_logprobs")
    if not isinstance(pl, list):
        return None, "the answer carries no prompt_logprobs (the server does not score given text)"
    ids = data.get("prompt_token_ids") or token_ids
    usage = data.get("usage") or {}
    n = usage.get("prompt_tokens")
    if not ids:
        return None, "the answer carries no prompt token ids (return_token_ids) and /tokenize gave none"
    if n is not None and not (len(pl) == n == len(ids)):
        return None, f"misaligned: {len(pl)} prompt_logprobs, {len(ids)} token ids, usage says {n} prompt tokens"
    if len(pl) != len(ids):
        return None, f"misaligned: {len(pl)} prompt_logprobs for {len(ids)} token ids"
    if not 0 < prefix_tokens < len(ids):
        return None, f"the answer has no tokens of its own (prompt {len(ids)} tokens, {prefix_tokens} before the answer)"
    out: dict[str, list[Any]] = {"ids": [], "text": [], "lp": [], "rank": [], "top_ids": [], "top_lp": [],
                                 "top1_text": []}
    for i in range(prefix_tokens, len(ids)):
        entry = pl[i]
        if not isinstance(entry, dict):
            return None, f"no log-probabilities at prompt position {i}"
        tok = ids[i]
        got = entry.get(str(tok)) or entry.get(tok)  # type: ignore[call-overload]
        if got is None:
            return None, f"prompt position {i}: the forced token {tok} is not among the returned log-probabilities"
        top = sorted(((int(t), v) for t, v in entry.items() if (v.get("rank") or 10**9) <= top_k),
                     key=lambda x: (x[1].get("rank") or 10**9, -x[1]["logprob"]))
        if not top:
            return None, f"prompt position {i}: no top-{top_k} log-probabilities"
        out["ids"].append(int(tok))
        out["text"].append(got.get("decoded_token"))
        out["lp"].append(round(float(got["logprob"]), 6))
        out["rank"].append(got.get("rank"))
        out["top_ids"].append([t for t, _ in top])
        out["top_lp"].append([round(float(v["logprob"]), 6) for _, v in top])
        out["top1_text"].append(top[0][1].get("decoded_token"))
    return out, None


def tokenize_count(data: dict[str, Any] | None) -> tuple[int | None, list[int] | None]:
    """`/tokenize`'s answer -> (count, ids)."""
    if not isinstance(data, dict):
        return None, None
    toks = data.get("tokens")
    n = data.get("count", len(toks) if isinstance(toks, list) else None)
    return (int(n) if n is not None else None), (toks if isinstance(toks, list) else None)
