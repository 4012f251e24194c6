"""Streaming chat-completions client: one request in, one fully measured result out, never raises.

Every outcome, including transport failures, comes back as a RequestResult with an error class,
so the runner can write a ledger row for it: nothing measured is lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from types import SimpleNamespace
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
    # where each read's time came from: "kernel" (SO_TIMESTAMPNS, the packet's receive time) or "user"
    # (the clock when the event loop ran the read); the user-space first-token time is kept beside it
    timestamp_source: str = "user"
    ttft_user_ms: float | None = None
    e2e_user_ms: float | None = None  # send to when the event loop got round to the end (E2E is the end's receive time)
    n_reads: int = 0
    first_read_chunks: int | None = None  # content chunks sharing the first token's receive time (1: exact)
    max_read_chunks: int = 0  # the most content chunks that shared one receive time
    cached_prompt_tokens: int | None = None  # prompt tokens the server's prefix cache served (usage details)
    # a reasoning model's thinking, streamed apart from its answer (delta `reasoning_content` or `reasoning`):
    # its text, the offset of the first answer token, and its token count (usage details, else its chunks)
    reasoning: str = ""
    answer_offset_ms: float | None = None
    reasoning_chunks: int = 0
    usage_reasoning_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def ttft_ms(self) -> float | None:
        return timing.ttft_ms(self.chunk_offsets_ms)

    @property
    def ttfo_ms(self) -> float | None:
        """The first answer token (TTFT is the first token of any kind: a reasoning one first)."""
        return self.answer_offset_ms

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens of reasoning: the server's usage details when it counts some, else one a streamed
        reasoning chunk (vLLM streams a token a chunk; a parser that cannot count reports 0 beside
        the reasoning it streamed); None for an answer without reasoning."""
        if self.usage_reasoning_tokens:
            return self.usage_reasoning_tokens
        return self.reasoning_chunks or None

    @property
    def reasoning_ms(self) -> float | None:
        """TTFO − TTFT: the time spent reasoning before the first answer token (None without reasoning)."""
        if not self.reasoning_chunks or self.ttft_ms is None:
            return None
        end = self.answer_offset_ms if self.answer_offset_ms is not None else self.e2e_ms
        return None if end is None else end - self.ttft_ms

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


class StreamParser:
    """Turns a streamed body into a RequestResult, whatever carried it (aiohttp, or the kernel-
    stamped client in `wire`). Each read comes with its arrival time; every SSE event completed
    by that read gets that time. ``user_s``: the user-space clock of the same read, kept for the
    first token so the client's own lag shows."""

    def __init__(self, res: RequestResult, t0: float) -> None:
        self.res, self.t0 = res, t0
        self.parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.buf = b""
        self.buf_at: tuple[float, float | None] = (t0, None)  # when the partial line in buf began arriving
        self.done = False
        self.end_at: float | None = None  # receive time of the read that carried [DONE] (else the last event)

    def feed(self, data: bytes, now: float, user_s: float | None = None) -> bool:
        """Apply one read; True at `data: [DONE]`. An event is timed by the read that brought its
        first byte (with small reads that read touched only the event's own TCP segment, so a
        late loop does not hand it a later segment's time)."""
        res = self.res
        res.n_reads += 1
        if not self.buf:
            self.buf_at = (now, user_s)
        self.buf += data
        if b"\n" not in data:
            return False
        *lines, self.buf = self.buf.split(b"\n")
        before = len(res.chunk_offsets_ms)
        at = self.buf_at
        for raw in lines:
            if raw and raw != b"\r" and self._line(raw.strip(), at[0]):  # blank lines separate events
                self.done = True
                break
            if len(res.chunk_offsets_ms) == 1 and before == 0 and res.ttft_user_ms is None:
                res.ttft_user_ms = ((at[1] if at[1] is not None else at[0]) - self.t0) * 1000
            at = (now, user_s)  # every later line began in this read
        self.buf_at = (now, user_s)
        return self.done

    def finish(self, now: float) -> None:
        """The stream ended at ``now`` (user space): E2E runs to the receive time of the read that
        ended it, the same clock TTFT uses; the user-space end stays beside it (e2e_user_ms)."""
        if not self.done and self.buf.strip():
            self.done = self._line(self.buf.strip(), self.buf_at[0])
        res = self.res
        res.e2e_user_ms = (now - self.t0) * 1000
        res.e2e_ms = ((self.end_at if self.end_at is not None else now) - self.t0) * 1000
        res.text = "".join(self.parts)
        res.reasoning = "".join(self.reasoning_parts)
        # Content events that share one receive time arrived (or were merged by TCP while the
        # client did not read) together: a first token sharing its time with later ones may be late.
        offs = res.chunk_offsets_ms
        if offs:
            res.first_read_chunks = sum(1 for x in offs if x == offs[0])
            run = best = 1
            for a, b in zip(offs, offs[1:], strict=False):
                run = run + 1 if b == a else 1
                best = max(best, run)
            res.max_read_chunks = best

    def _line(self, line: bytes, now: float) -> bool:
        res = self.res
        if not line or line[:1] == b":":
            return False
        if not line.startswith(b"data:"):
            res.n_malformed += 1
            return False
        data = line[5:].strip()
        if res.first_chunk_ms is None:
            res.first_chunk_ms = (now - self.t0) * 1000
        self.end_at = now
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
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                res.cached_prompt_tokens = details["cached_tokens"]
            out = usage.get("completion_tokens_details") or {}
            if isinstance(out, dict) and out.get("reasoning_tokens") is not None:
                res.usage_reasoning_tokens = out["reasoning_tokens"]
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            # reasoning: `reasoning_content` (vLLM ≤ 0.10, DeepSeek), `reasoning` (newer vLLM, OpenRouter)
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            content = delta.get("content")
            if thought or content:  # a token of any kind: TTFT, ITL and TPOT count both
                res.chunk_offsets_ms.append((now - self.t0) * 1000)
            if thought:
                res.reasoning_chunks += 1
                self.reasoning_parts.append(thought)
            if content:
                if res.answer_offset_ms is None:
                    res.answer_offset_ms = (now - self.t0) * 1000
                self.parts.append(content)
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]
        return False


def classify_end(res: RequestResult, done: bool) -> None:
    """A stream that ended without an error still fails if it was cut, malformed or empty."""
    if res.error_class is not None:
        return
    if not done and res.finish_reason is None:
        res.error_class = "stream_cut"
        res.error = "stream ended without [DONE] or a finish_reason"
    elif res.n_malformed and not res.text:
        res.error_class = "malformed_stream"
        res.error = f"{res.n_malformed} malformed SSE lines and no content"
    elif not res.text:
        res.error_class = "empty_completion"
        res.error = f"finish_reason={res.finish_reason}"


def retry_after(value: str | None) -> float | None:
    return float(value) if value and value.replace(".", "", 1).isdigit() else None


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
    t0 = time.perf_counter()
    sent = SimpleNamespace(at=None)
    parser = StreamParser(res, t0)
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.post(url, json=payload, headers=headers or {}, timeout=timeout, trace_request_ctx=sent) as resp:
            if sent.at is not None:  # the session stamps the moment its connection was ready (SEND_STAMP)
                t0 = parser.t0 = sent.at
            res.http_status = resp.status
            if resp.status != 200:
                res.retry_after_s = retry_after(resp.headers.get("Retry-After"))
                body = await resp.text(errors="replace")
                res.error_class = f"http_{resp.status}"
                res.error = body[:2000]
                res.e2e_ms = res.e2e_user_ms = (time.perf_counter() - t0) * 1000
                if epoch is not None:
                    res.mono_start_ms = (t0 - epoch) * 1000
                return res
            # Read whatever bytes have arrived: one await per network read instead of one per SSE
            # line. Events that arrived in the same read get the same arrival time.
            async for data in resp.content.iter_any():
                if parser.feed(data, time.perf_counter()):
                    break
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
    if epoch is not None:
        res.mono_start_ms = (t0 - epoch) * 1000
    parser.finish(time.perf_counter())
    classify_end(res, parser.done)
    return res


def _stamp(session: object, ctx: SimpleNamespace, params: object) -> Awaitable[None]:
    if isinstance(ctx.trace_request_ctx, SimpleNamespace):
        ctx.trace_request_ctx.at = time.perf_counter()

    async def done() -> None:
        return None

    return done()


def send_stamp() -> aiohttp.TraceConfig:
    """A trace for aiohttp sessions: each request's send instant is stamped when its connection is
    ready (new or reused), as the kernel-stamped client stamps it, so connecting is not TTFT."""
    tc = aiohttp.TraceConfig()
    tc.on_connection_create_end.append(_stamp)  # type: ignore[arg-type]
    tc.on_connection_reuseconn.append(_stamp)  # type: ignore[arg-type]
    return tc
