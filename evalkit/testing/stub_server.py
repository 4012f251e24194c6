"""A fast, deterministic OpenAI-compatible streaming server for tests and client benchmarks.

It speaks the same SSE shape as vLLM (a role-only first chunk, content chunks, a finish chunk,
a usage chunk, ``[DONE]``), produces schema-valid JSON when ``response_format`` asks for it, and
can inject faults. It is never a stand-in for vLLM in evaluation runs; it exists so the client,
runner and ledger can be tested in seconds.

    python -m evalkit.testing.stub_server --port 8765 --ttft-ms 20 --itl-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .cpu_burn import burn
from .kvsim import KvSim
from .stub_reasoning import think
from .stub_scoring import is_scoring, score_response, tokenize_response
from .stub_text import _text, answer_text

FAULTS = ("http_500", "http_503", "http_429", "cut", "malformed", "stall", "empty", "not_json", "echo_auth")


@dataclass
class StubConfig:
    model: str = "stub-model"
    ttft_ms: float = 5.0
    itl_ms: float = 1.0
    chars_per_chunk: int = 4
    max_chunks: int | None = None
    usage: bool = True  # send the final usage chunk (stream_options.include_usage)
    fixed_text: str | None = None  # reply with exactly this text (e.g. a judge's "Score: 4")
    role_chunk: bool = True  # vLLM sends {"role": "assistant", "content": ""} first
    fixed_chunks: int | None = None  # benchmarks: exactly this many 1-token chunks of text
    stamp: bool = False  # benchmarks: first content chunk starts "R<n>|", its send time kept in stamps
    stamps: dict[int, float] = field(default_factory=dict)
    done_stamps: dict[int, float] = field(default_factory=dict)  # with stamp: when [DONE] was written
    pre_stamps: dict[int, float] = field(default_factory=dict)  # with stamp: before the first write, after the close
    closed_stamps: dict[int, float] = field(default_factory=dict)
    arrivals: list[float] = field(default_factory=list)
    fault: str | None = None  # a fault name, applied to every Nth request (1 = all)
    fault_every: int = 1
    counters: dict[str, int] = field(default_factory=lambda: {"requests": 0, "faults": 0})
    hist: dict[str, tuple[int, float]] = field(default_factory=dict)  # /metrics histograms: name -> (count, sum)
    running: int = 0
    # simulated pressure: KV use per running request; a preemption per request started above `preempt_over`
    kv_per_request: float = 1 / 64
    preempt_over: int | None = None
    preemptions: int = 0
    num_blocks: int = 1024
    block_size: int = 16
    metrics_fail_every: int | None = None  # /metrics answers 500 every Nth scrape after the first
    histograms: bool = True  # False: /metrics without vLLM's request histograms (another engine's)
    sum_accuracy: float | None = None  # answer "What is A + B?" questions right this share of the time (`stub_text`)
    reasoning_chunks: int = 0  # a reasoning model: this many thinking tokens first (`stub_reasoning`), in the field
    reasoning_field: str = "reasoning_content"  # `reasoning_content` (vLLM <= 0.10) or `reasoning` (newer)
    # token-exact KV pressure (kvsim): capacity in tokens; `ignore_eos` requests make exactly max_tokens tokens
    kv_tokens: int | None = None
    max_num_seqs: int = 256
    batch_slowdown: float = 0.0  # each extra running request slows decode by this share
    per_request_metrics: bool = False  # the final chunk carries vLLM's per-request `metrics`
    cpu_units: int = 0  # CPU work per token (`cpu_burn`): a neighbour on the stub's core slows it, as a real engine
    jitter_ms: float = 0.0  # each reply's TTFT gets a seeded uniform extra of up to this much
    seed: int = 0
    # a prefix cache over 16-word blocks, leading blocks seen before "cached" (usage details, /metrics)
    prefix_cache: bool = False
    prefix_blocks: set[int] = field(default_factory=set)
    prefix_queries: int = 0
    prefix_hits: int = 0
    keep_bodies: bool = False  # tests: every chat request body, in order
    numbered: bool = False  # tests: each reply names its request number, so replies can be told apart
    bodies: list[dict[str, Any]] = field(default_factory=list)
    kv: Any = None
    # scoring (stub_scoring.py): "vllm" answers prompt_logprobs as vLLM 0.32; "ignore"/"reject" do not
    scoring: str = "vllm"
    max_logprobs: int = 20
    tokenizer: str = "words"
    logit_noise: float = 0.0
    noise_seed: int = 1
    batch_noise: float = 0.0
    scoring_running: int = 0


HISTS = ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
         "request_prefill_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds")


def kv_sim(cfg: StubConfig) -> KvSim | None:
    if cfg.kv_tokens is not None and cfg.kv is None:
        cfg.kv = KvSim(cfg.kv_tokens, cfg.block_size, cfg.max_num_seqs)
    return cfg.kv


def metrics_text(cfg: StubConfig) -> str:
    """A vLLM-shaped exposition: the same names, so the scraper and attribution can be tested."""
    lab = f'engine="0",model_name="{cfg.model}"'
    kv = kv_sim(cfg)
    usage = kv.usage if kv else min(1.0, cfg.running * cfg.kv_per_request)
    waiting = kv.waiting if kv else 0
    blocks = kv.total_blocks if kv else cfg.num_blocks
    lines = [
        f"vllm:num_requests_running{{{lab}}} {float(kv.running if kv else cfg.running)}",
        f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
        f"vllm:kv_cache_usage_perc{{{lab}}} {usage:.6f}",
        f"vllm:num_preemptions_total{{{lab}}} {float(cfg.preemptions + (kv.preemptions if kv else 0))}",
        f"vllm:prefix_cache_queries_total{{{lab}}} {float(cfg.prefix_queries)}",
        f"vllm:prefix_cache_hits_total{{{lab}}} {float(cfg.prefix_hits)}",
        f"vllm:cache_config_info{{block_size=\"{cfg.block_size}\",cache_dtype=\"auto\",{lab},"
        f"num_gpu_blocks=\"{blocks}\"}} 1.0",
    ]
    for h in HISTS if cfg.histograms else ():
        n, total = cfg.hist.get(h, (0, 0.0))
        lines.append(f"vllm:{h}_count{{{lab}}} {float(n)}")
        lines.append(f"vllm:{h}_sum{{{lab}}} {total}")
    return "\n".join(lines) + "\n"


def _prompt_tokens(body: dict[str, Any]) -> int:
    """The stub's token count of a prompt: its words (what its usage chunk reports)."""
    return sum(len(_text(m.get("content")).split()) for m in body.get("messages", []))


def _prefix_lookup(cfg: StubConfig, body: dict[str, Any]) -> int:
    """Cached words of this prompt: its leading 16-word blocks whose whole prefix was seen before."""
    words = " ".join(_text(m.get("content")) for m in body.get("messages", [])).split()
    cached, seen_all = 0, True
    for k in range(len(words) // 16):
        h = hash(tuple(words[: (k + 1) * 16]))
        cfg.prefix_queries += 16
        if seen_all and h in cfg.prefix_blocks:
            cached += 16
            cfg.prefix_hits += 16
        else:
            seen_all = False
        cfg.prefix_blocks.add(h)
    return cached


def _request_metrics(times: dict[str, float], n_tokens: int) -> dict[str, Any]:
    """vLLM's per-request `metrics` object (--enable-per-request-metrics), from the stub's own clock."""
    now = times.get("end", time.perf_counter())
    first = times.get("first", now)
    gen = now - first
    return {"time_to_first_token_ms": (first - times["scheduled"]) * 1000,
            "queue_time_ms": (times["scheduled"] - times["arrived"]) * 1000, "generation_time_ms": gen * 1000,
            "mean_itl_ms": gen * 1000 / (n_tokens - 1) if n_tokens > 1 else None,
            "tokens_per_second": n_tokens / (now - times["scheduled"]) if now > times["scheduled"] else None}


def _chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"id": rid, "object": "chat.completion.chunk", "created": 0, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def make_app(cfg: StubConfig) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": cfg.model, "object": "model"}]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "stub"})

    async def stats(request: web.Request) -> web.Response:
        out = {"stamps": cfg.stamps, "requests": cfg.counters["requests"], "arrivals": cfg.arrivals}
        if request.query.get("reset"):
            cfg.arrivals = []
        return web.json_response(out)

    async def metrics(_: web.Request) -> web.Response:
        cfg.counters["scrapes"] = n = cfg.counters.get("scrapes", 0) + 1
        if cfg.metrics_fail_every and n > 1 and n % cfg.metrics_fail_every == 0:
            return web.Response(status=500, text="busy")
        return web.Response(text=metrics_text(cfg), content_type="text/plain")

    def record(phases: dict[str, float]) -> None:
        # a running count and sum (what /metrics shows): a scrape costs the same at the millionth request
        for k, v in phases.items():
            n, total = cfg.hist.get(k, (0, 0.0))
            cfg.hist[k] = (n + 1, total + v)

    async def chat_or_score(request: web.Request) -> web.StreamResponse:
        """Scoring requests (not streamed, with prompt_logprobs) are answered apart: they are never
        counted as chat requests or given injected faults."""
        if request.content_type == "application/json":
            body = await request.json()  # aiohttp keeps the body: `chat` reads it again
            if isinstance(body, dict) and is_scoring(body):
                cfg.scoring_running += 1
                try:
                    await asyncio.sleep(cfg.ttft_ms / 1000)  # the prefill
                    return score_response(cfg, body, cfg.counters.get("scoring", 0) + 1)
                finally:
                    cfg.scoring_running -= 1
        return await chat(request)

    async def tokenize(request: web.Request) -> web.Response:
        return tokenize_response(cfg, await request.json())

    async def chat(request: web.Request) -> web.StreamResponse:
        cfg.arrivals.append(time.perf_counter())  # when each request reached the server (benchmarks)
        cfg.counters["requests"] += 1
        n = cfg.counters["requests"]
        fault = cfg.fault if cfg.fault and n % cfg.fault_every == 0 else None
        fault = request.headers.get("X-Stub-Fault", fault)
        if fault:
            cfg.counters["faults"] += 1
        if fault in ("http_500", "http_503"):
            return web.json_response({"error": {"message": "injected"}}, status=int(fault[5:]))
        if fault == "echo_auth":  # a careless server that echoes the caller's credentials in its error
            return web.json_response({"error": {"message": f"bad key: {request.headers.get('Authorization')}"}},
                                     status=401)
        if fault == "http_429":
            return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "1"})
        body = await request.json()
        text = "" if fault == "empty" else answer_text(body, f"{cfg.model} reply {n}" if cfg.numbered else "the request",
                                                       cfg.sum_accuracy, cfg.seed)
        if cfg.fixed_text is not None:
            text = cfg.fixed_text
        if cfg.keep_bodies and not body.get("stream"):  # a judge's request, not streamed
            cfg.bodies.append(body)
        if not body.get("stream"):
            prompt, words = _prompt_tokens(body), len(text.split())
            return web.json_response({"id": f"chatcmpl-stub-{n}", "object": "chat.completion", "model": cfg.model,
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": text}}],
                                      "usage": {"prompt_tokens": prompt, "completion_tokens": words,
                                                "total_tokens": prompt + words}})
        if cfg.fixed_chunks is not None:
            text = "tok " * cfg.fixed_chunks
        elif body.get("ignore_eos"):
            text = "tok " * int(body.get("max_tokens") or 16)  # exactly max_tokens 1-token chunks
        if cfg.keep_bodies:
            cfg.bodies.append(body)
        if fault == "not_json":
            text = "Sure! Here is your email: Dear hiring manager, ..."
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        t0 = time.perf_counter()
        times = {"arrived": t0}
        kv = kv_sim(cfg)
        prompt = _prompt_tokens(body)
        if kv is not None:
            await kv.admit(n, prompt)
        times["scheduled"] = time.perf_counter()
        cfg.running += 1
        if cfg.preempt_over is not None and cfg.running > cfg.preempt_over:
            cfg.preemptions += 1
        try:
            return await _stream(request, resp, body, text, fault, n, times)
        finally:
            cfg.running -= 1
            if kv is not None:
                kv.release(n)
            # vLLM's engine records a request's end when its last token is made, before the frontend
            # writes the closing chunks: a stalled handler must not stretch the server's E2E past the client's
            now = times.get("end", time.perf_counter())
            e2e, queue = now - t0, times["scheduled"] - t0
            first = times.get("first", times["scheduled"] + cfg.ttft_ms / 1000)
            record({"time_to_first_token_seconds": first - t0, "e2e_request_latency_seconds": e2e,
                    "request_queue_time_seconds": queue, "request_prefill_time_seconds": first - times["scheduled"],
                    "request_decode_time_seconds": max(0.0, now - first),
                    "request_inference_time_seconds": now - times["scheduled"]})

    async def _stream(request: web.Request, resp: web.StreamResponse, body: dict[str, Any], text: str,
                      fault: str | None, n: int, times: dict[str, float]) -> web.StreamResponse:
        rid = f"chatcmpl-stub-{n}"
        model = body.get("model", cfg.model)
        kv = cfg.kv
        if cfg.role_chunk:
            await resp.write(_chunk(rid, model, {"role": "assistant", "content": ""}))
        extra = random.Random(cfg.seed * 100003 + n).uniform(0, cfg.jitter_ms) if cfg.jitter_ms else 0.0
        await asyncio.sleep((cfg.ttft_ms + extra) / 1000)
        thought = await think(resp, rid, model, cfg.reasoning_chunks, cfg.reasoning_field, cfg.itl_ms)
        step = 4 if cfg.fixed_chunks is not None else cfg.chars_per_chunk
        pieces = [text[i:i + step] for i in range(0, len(text), step)]
        if cfg.stamp and pieces:
            pieces[0] = f"R{n}|" + pieces[0]
        if cfg.max_chunks is not None:
            pieces = pieces[: cfg.max_chunks]
        for i, piece in enumerate(pieces):
            if i:
                running = kv.running if kv is not None else cfg.running
                await asyncio.sleep(cfg.itl_ms / 1000 * (1 + cfg.batch_slowdown * max(0, running - 1)))
            if kv is not None and not kv.grow(n):  # preempted: wait to be recomputed, then go on
                await kv.admit(n, _prompt_tokens(body) + i)
                await asyncio.sleep(cfg.ttft_ms / 1000)
                kv.grow(n)
            # the engine's token exists before the frontend sends it: stamped before the write, so a
            # handler descheduled inside the write cannot put the server's TTFT after the client's
            if cfg.cpu_units:
                burn(cfg.cpu_units)
            times.setdefault("first", time.perf_counter())
            if cfg.stamp and i == 0:
                cfg.pre_stamps[n] = times["first"]
            await resp.write(_chunk(rid, model, {"content": piece}))
            if cfg.stamp and i == 0:
                cfg.stamps[n] = time.perf_counter()
            if fault == "malformed" and i == 0:
                await resp.write(b"data: {not json\n\nthis is not an sse line\n\n")
            if fault == "cut" and i == len(pieces) // 2:
                # drop the connection mid-response, without a finish chunk or [DONE]
                request.transport.close()  # type: ignore[union-attr]
                # aiohttp treats a cancelled handler as a client that went away: no error response
                raise asyncio.CancelledError
            if fault == "stall" and i == 0:
                await asyncio.sleep(3600)
        times["end"] = time.perf_counter()
        await resp.write(_chunk(rid, model, {}, "length" if cfg.max_chunks else "stop"))
        usage: dict[str, Any] = {"prompt_tokens": _prompt_tokens(body), "completion_tokens": len(pieces) + thought,
                                 **({"completion_tokens_details": {"reasoning_tokens": thought}} if thought else {})}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if cfg.prefix_cache:
            usage["prompt_tokens_details"] = {"cached_tokens": _prefix_lookup(cfg, body)}
        if cfg.usage:
            final: dict[str, Any] = {"id": rid, "choices": [], "usage": usage}
            if cfg.per_request_metrics:
                final["metrics"] = _request_metrics(times, len(pieces))
            await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        if cfg.stamp:
            cfg.done_stamps[n] = time.perf_counter()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        if cfg.stamp:
            cfg.closed_stamps[n] = time.perf_counter()
        return resp

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models), web.get("/version", version),
                    web.get("/metrics", metrics), web.get("/stats", stats),
                    web.post("/v1/chat/completions", chat_or_score), web.post("/tokenize", tokenize)])
    return app


class StubServer:
    """Runs the stub in a background thread on 127.0.0.1 (a free port unless given)."""

    def __init__(self, cfg: StubConfig | None = None, port: int = 0) -> None:
        self.cfg = cfg or StubConfig()
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(make_app(self.cfg), access_log=None, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> StubServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description="evalkit's stub OpenAI-compatible streaming server")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--fault", choices=FAULTS, default=None)
    ap.add_argument("--fault-every", type=int, default=1)
    ap.add_argument("--no-role-chunk", action="store_true", help="first chunk carries content (benchmarks)")
    ap.add_argument("--fixed-chunks", type=int, default=None, help="exactly N content chunks per reply")  # benchmarks
    ap.add_argument("--stamp", action="store_true", help="record first-content send times, served on /stats")
    ap.add_argument("--kv-tokens", type=int, default=None, help="token-exact KV pressure with this capacity")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256, help="with --kv-tokens: parallel slots (the rest wait)")
    ap.add_argument("--batch-slowdown", type=float, default=0.0, help="decode slowdown per extra running request")
    ap.add_argument("--enable-per-request-metrics", action="store_true", help="vLLM's per-request `metrics`")
    ap.add_argument("--cpu-units", type=int, default=0, help="CPU work per token (~1 us a unit): a CPU-bound server")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="each reply's TTFT gets a seeded extra of up to this")
    ap.add_argument("--seed", type=int, default=0, help="the jitter's seed")
    a = ap.parse_args()
    cfg = StubConfig(ttft_ms=a.ttft_ms, itl_ms=a.itl_ms, fault=a.fault, fault_every=a.fault_every,
                     role_chunk=not a.no_role_chunk, fixed_chunks=a.fixed_chunks, stamp=a.stamp, kv_tokens=a.kv_tokens,
                     block_size=a.block_size, max_num_seqs=a.max_num_seqs, batch_slowdown=a.batch_slowdown,
                     per_request_metrics=a.enable_per_request_metrics, cpu_units=a.cpu_units, jitter_ms=a.jitter_ms,
                     seed=a.seed)
    web.run_app(make_app(cfg), host="127.0.0.1", port=a.port, access_log=None)


if __name__ == "__main__":
    main()
