"""How much the client itself adds: evalkit's streaming client vs vLLM's `bench serve` client.

Both clients talk to the same stub SSE server, in its own process pinned to the other core. The
stub stamps the moment it writes each reply's first content chunk (perf_counter is
CLOCK_MONOTONIC, shared by processes on Linux); a client's *added TTFT error* is when it says the
first token arrived minus when the server wrote it: socket, event loop and parsing delay.
*Parse throughput* is content chunks handled per CPU-second of the client process (one core).

    .venv/bin/python benchmarks/client_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.measure.client import build_payload, stream_chat  # noqa: E402

# (request index in the reply text, perf_counter seconds when the first token arrived, chunks seen)
Measured = tuple[int, float, int]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stub(port: int, *args: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(port), "--no-role-chunk",
                          "--stamp", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(p.pid, {1})
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("stub did not start")


def _index(text: str) -> int:
    return int(text[1:text.index("|")])


async def evalkit_one(session: aiohttp.ClientSession, url: str) -> Measured:
    payload = build_payload("stub-model", [{"role": "user", "content": "hi"}], max_tokens=16, temperature=0,
                            seed=None)
    r = await stream_chat(session, url, payload, epoch=0.0)  # epoch 0: mono_start_ms is absolute
    assert r.ok and r.ttft_ms is not None and r.mono_start_ms is not None, r.error
    return _index(r.text), (r.mono_start_ms + r.ttft_ms) / 1000.0, len(r.chunk_offsets_ms)


def make_vllm_one() -> Callable[[aiohttp.ClientSession, str], Awaitable[Measured]]:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    async def one(session: aiohttp.ClientSession, url: str) -> Measured:
        inp = RequestFuncInput(prompt="hi", api_url=url, prompt_len=1, output_len=16, model="stub-model")
        out = await async_request_openai_chat_completions(inp, session)
        assert out.success, out.error
        return _index(out.generated_text), out.start_time + out.ttft, len(out.itl) + 1

    return one


async def drive(one: Callable[[aiohttp.ClientSession, str], Awaitable[Measured]], url: str, n: int,
                concurrency: int) -> tuple[list[Measured], float]:
    sem = asyncio.Semaphore(concurrency)
    out: list[Measured] = []

    async def task() -> None:
        async with sem:
            out.append(await one(session, url))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        cpu0 = time.process_time()
        await asyncio.gather(*(task() for _ in range(n)))
        cpu = time.process_time() - cpu0
    return out, cpu


def stamps(port: int) -> dict[int, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as r:
        return {int(k): v for k, v in json.loads(r.read())["stamps"].items()}


def measure(name: str, one: Callable, stub_args: list[str], n: int, concurrency: int) -> dict[str, float]:
    port = free_port()
    stub = start_stub(port, *stub_args)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        asyncio.run(drive(one, url, min(8, n), min(8, concurrency)))  # warm up connections and imports
        got, cpu = asyncio.run(drive(one, url, n, concurrency))
        sent = stamps(port)
    finally:
        stub.terminate()
        stub.wait()
    errs = sorted((arrival - sent[i]) * 1000 for i, arrival, _ in got)
    chunks = sum(c for _, _, c in got)
    return {"client": name, "n": len(got), "concurrency": concurrency,
            "ttft_err_p50_ms": statistics.median(errs), "ttft_err_p99_ms": errs[int(0.99 * (len(errs) - 1))],
            "chunks": chunks, "cpu_s": cpu, "chunks_per_cpu_s": chunks / cpu if cpu else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})  # the client on core 0, the stub on core 1
    clients = {"evalkit": evalkit_one, "vllm bench serve": make_vllm_one()}
    scale = 4 if a.quick else 1
    rows = []
    # Added TTFT error: short replies, a 20 ms server-side TTFT, at 1, 64 and 256 streams.
    for conc, n in ((1, 200), (64, 1024), (256, 2048)):
        for name, one in clients.items():
            rows.append(measure(name, one, ["--ttft-ms", "20", "--itl-ms", "5", "--fixed-chunks", "8"],
                                max(conc, n // scale), conc))
            print(json.dumps(rows[-1]), flush=True)
    # Parse throughput: long replies sent as fast as the stub can (no sleeps), 16 streams.
    thr = []
    for name, one in clients.items():
        thr.append(measure(name, one, ["--ttft-ms", "0", "--itl-ms", "0", "--fixed-chunks", "2000"],
                           max(16, 128 // scale), 16))
        print(json.dumps(thr[-1]), flush=True)

    print("\n| streams | client | added TTFT error p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['client']} | {r['ttft_err_p50_ms']:.3f} | {r['ttft_err_p99_ms']:.3f} |")
    print("\n| client | content chunks parsed per CPU-second (one core) |")
    print("|---|---|")
    for r in thr:
        print(f"| {r['client']} | {r['chunks_per_cpu_s']:,.0f} |")
    ev, vl = thr[0]["chunks_per_cpu_s"], thr[1]["chunks_per_cpu_s"]
    print(f"\nparse throughput ratio evalkit / vllm bench serve: {ev / vl:.2f}x")
    for conc in (1, 64, 256):
        e = next(r for r in rows if r["client"] == "evalkit" and r["concurrency"] == conc)
        v = next(r for r in rows if r["client"] != "evalkit" and r["concurrency"] == conc)
        print(f"added TTFT error p50 at {conc} streams: evalkit {e['ttft_err_p50_ms']:.3f} ms, "
              f"vllm {v['ttft_err_p50_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
