"""Streaming chat-completions client: one request in, one fully measured result out, never raises.

Every outcome, including transport failures, comes back as a RequestResult with an error class,
so the runner can write a ledger row for it: nothing measured is lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..ledger import utcnow
from . import timing


@dataclass
class RequestResult:
    started_at: str
    http_status: int | None = None
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str | None = None
    e2e_ms: float | None = None
    first_chunk_ms: float | None = None  # first SSE data event of any kind (what `bench serve` chat calls TTFT)
    retry_after_s: float | None = None
    mono_start_ms: float | None = None  # send time on the run's perf_counter clock (joins /metrics scrapes)
    chunk_offsets_ms: list[float] = field(default_factory=list)
    n_chunks: int = 0
    n_malformed: int = 0
    error_class: str | None = None
    error: str | None = None
    # the server's own timing of this request (vLLM --enable-per-request-metrics: the final chunk's `metrics`)
    server_timing: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def ttft_ms(self) -> float | None:
        return timing.ttft_ms(self.chunk_offsets_ms)

    @property
    def itl_mean_ms(self) -> float | None:
        return timing.itl_mean_ms(self.chunk_offsets_ms)

    @property
    def tpot_ms(self) -> float | None:
        return timing.tpot_ms(self.e2e_ms, self.ttft_ms, self.completion_tokens)


def build_payload(
    model: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    top_p: float | None = None,
    schema_name: str | None = None,
    schema: dict[str, Any] | None = None,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        # usage in the final chunk: token counts from the server, not a client tokenizer
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    if top_p is not None:
        body["top_p"] = top_p
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema_name or "output", "schema": schema, "strict": True},
        }
    body.update(extra_body or {})
    return body


def _handle_line(line: bytes, now: float, t0: float, res: RequestResult, parts: list[str]) -> bool:
    """Apply one SSE line to the result; True at `data: [DONE]`."""
    if not line or line[:1] == b":":
        return False
    if not line.startswith(b"data:"):
        res.n_malformed += 1
        return False
    data = line[5:].strip()
    if res.first_chunk_ms is None:
        res.first_chunk_ms = (now - t0) * 1000
    if data == b"[DONE]":
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        res.n_malformed += 1
        return False
    res.n_chunks += 1
    if not isinstance(obj, dict):
        res.n_malformed += 1
        return False
    if obj.get("error"):
        res.error_class = "server_error"
        res.error = json.dumps(obj["error"])[:2000]
        return False
    if isinstance(obj.get("metrics"), dict):
        res.server_timing = obj["metrics"]
    usage = obj.get("usage")
    if usage:
        res.prompt_tokens = usage.get("prompt_tokens")
        res.completion_tokens = usage.get("completion_tokens")
        res.usage_source = "stream_usage"
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        content = delta.get("content") if delta else None
        if content:
            res.chunk_offsets_ms.append((now - t0) * 1000)
            parts.append(content)
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
    return False


async def stream_chat(
    http: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    epoch: float | None = None,
) -> RequestResult:
    res = RequestResult(started_at=utcnow())
    parts: list[str] = []
    done = False
    t0 = time.perf_counter()
    if epoch is not None:
        res.mono_start_ms = (t0 - epoch) * 1000
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.post(url, json=payload, headers=headers or {}, timeout=timeout) as resp:
            res.http_status = resp.status
            if resp.status != 200:
                ra = resp.headers.get("Retry-After")
                res.retry_after_s = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
                body = await resp.text(errors="replace")
                res.error_class = f"http_{resp.status}"
                res.error = body[:2000]
                res.e2e_ms = (time.perf_counter() - t0) * 1000
                return res
            # Read whatever bytes have arrived and split them into lines ourselves: one await per
            # network read instead of one per SSE line. Events that arrived in the same read get the
            # same arrival time, which is when they really arrived.
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buf += data
                if b"\n" not in data:
                    continue
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    if _handle_line(raw.strip(), now, t0, res, parts):
                        done = True
                        break
                if done:
                    break
            if not done and buf.strip():
                done = _handle_line(buf.strip(), time.perf_counter(), t0, res, parts)
    except asyncio.TimeoutError:
        res.error_class = "timeout"
        res.error = f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientConnectorError as e:
        res.error_class = "connect_error"
        res.error = str(e)[:500]
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
        res.error_class = "stream_cut"
        res.error = f"{type(e).__name__}: {e}"[:500]
    except aiohttp.ClientError as e:
        # e.g. ClientOSError "connection reset": after the headers it cut a stream, before them it
        # failed to connect
        res.error_class = "stream_cut" if res.http_status is not None else "connect_error"
        res.error = f"{type(e).__name__}: {e}"[:500]
    res.e2e_ms = (time.perf_counter() - t0) * 1000
    res.text = "".join(parts)
    if res.error_class is None:
        if not done and res.finish_reason is None:
            res.error_class = "stream_cut"
            res.error = "stream ended without [DONE] or a finish_reason"
        elif res.n_malformed and not parts:
            res.error_class = "malformed_stream"
            res.error = f"{res.n_malformed} malformed SSE lines and no content"
        elif not res.text:
            res.error_class = "empty_completion"
            res.error = f"finish_reason={res.finish_reason}"
    return res
