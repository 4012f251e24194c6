"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, for tests of the launch path:
it takes vLLM's command line (--model, --port, --kv-cache-memory-bytes, --block-size,
--num-gpu-blocks-override, --max-num-seqs, --enable-per-request-metrics; the rest is ignored),
sizes a token-exact KV cache from the checkpoint's config the way vLLM does, logs "Model loading
took X GiB" like vLLM, starts a child process the way vLLM starts its engine core (so tests can
check that a stop leaves none behind), and serves the stub's OpenAI-compatible API.

Selected with EVALKIT_VLLM_MODULE=evalkit.testing.fake_vllm. Knobs: EVALKIT_FAKE_TTFT_MS,
EVALKIT_FAKE_ITL_MS, EVALKIT_FAKE_SLOWDOWN (decode slowdown per extra running request),
EVALKIT_FAKE_EXIT_AFTER (the API process exits with code 3 after that many requests, leaving its
engine child behind as a crashed vLLM would)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from aiohttp import web

from ..engines.memory import kv_bytes_per_token, weight_bytes
from .stub_server import StubConfig, make_app

ENGINE_MARK = "evalkit-fake-vllm-engine-core"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--enable-per-request-metrics", action="store_true")
    ap.add_argument("--enable-sleep-mode", action="store_true")
    a, _ = ap.parse_known_args(argv)
    per_tok = kv_bytes_per_token(a.model, a.dtype) or 1024
    if a.num_gpu_blocks_override:
        blocks = a.num_gpu_blocks_override
    elif a.kv_cache_memory_bytes:
        blocks = a.kv_cache_memory_bytes // (a.block_size * per_tok)
    else:
        blocks = 1024
    w = weight_bytes(a.model, a.dtype) or 0
    print(f"INFO fake vLLM: Model loading took {w / 1024**3:.4f} GiB memory and 0.01 seconds", flush=True)
    print(f"INFO fake vLLM: # KV cache blocks: {blocks} of {a.block_size} tokens", flush=True)
    # the engine core: a child that outlives a crashed API process unless its group is stopped
    engine = subprocess.Popen([sys.executable, "-c", f"import time  # {ENGINE_MARK}\nwhile True: time.sleep(60)"])
    cfg = StubConfig(model=a.served_model_name or a.model, ttft_ms=float(os.environ.get("EVALKIT_FAKE_TTFT_MS", "5")),
                     itl_ms=float(os.environ.get("EVALKIT_FAKE_ITL_MS", "1")), kv_tokens=blocks * a.block_size,
                     block_size=a.block_size, max_num_seqs=a.max_num_seqs,
                     batch_slowdown=float(os.environ.get("EVALKIT_FAKE_SLOWDOWN", "0")),
                     per_request_metrics=a.enable_per_request_metrics)
    app = make_app(cfg)
    if a.enable_sleep_mode:  # vLLM's sleep mode: /sleep frees the accelerator, /wake_up brings it back
        state = {"asleep": False}

        async def sleep(_: web.Request) -> web.Response:
            state["asleep"] = True
            cfg.counters["sleeps"] = cfg.counters.get("sleeps", 0) + 1
            return web.Response(status=200)

        async def wake_up(_: web.Request) -> web.Response:
            state["asleep"] = False
            return web.Response(status=200)

        @web.middleware
        async def asleep(request: web.Request, handler):  # type: ignore[no-untyped-def]
            if state["asleep"] and request.path.endswith("/chat/completions"):
                return web.json_response({"error": {"message": "the engine is asleep"}}, status=503)
            return await handler(request)

        app.router.add_post("/sleep", sleep)
        app.router.add_post("/wake_up", wake_up)
        app.middlewares.append(asleep)
    exit_after = int(os.environ.get("EVALKIT_FAKE_EXIT_AFTER", "0") or 0)
    if exit_after:
        @web.middleware
        async def die(request: web.Request, handler):  # type: ignore[no-untyped-def]
            if request.path.endswith("/chat/completions") and cfg.counters["requests"] >= exit_after:
                os._exit(3)  # like a crash: no cleanup, the engine child stays
            return await handler(request)

        app.middlewares.append(die)
    print(f"INFO fake vLLM: engine core pid {engine.pid}; serving on {a.host}:{a.port}", flush=True)
    web.run_app(app, host=a.host, port=a.port, access_log=None, print=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
