"""How much the client itself adds: evalkit with kernel receive stamps, evalkit with user-space
stamps (its aiohttp path) and vLLM's `bench serve` client, side by side in one run.

All talk to the same stub SSE server, in its own process pinned to the other core. The stub
stamps the moment it writes each reply's first content chunk (perf_counter is CLOCK_MONOTONIC,
shared by processes on Linux); a client's *added TTFT error* is when it says the first token
arrived minus when the server wrote it: socket, event loop and parsing delay. Staggered: N
streams in flight over many requests (a semaphore); synchronized: N requests started at once,
500 ms TTFT, 4 chunks 250 ms apart. *Parse throughput* is content chunks handled per CPU-second
of the client process (one core).

    .venv/bin/python benchmarks/client_overhead.py [--quick] [--max-streams 4096]
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
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.measure.client import build_payload, stream_chat  # noqa: E402
from evalkit.measure.wire import WireClient, stream_chat_wire  # noqa: E402

# (request index in the reply text, perf_counter seconds when the first token arrived, chunks seen,
#  SSE events the first token's read held: kernel stamps only, else 1)
Measured = tuple[int, float, int, int]


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
    """evalkit's aiohttp path: the time is the event loop's when it runs the read."""
    payload = build_payload("stub-model", [{"role": "user", "content": "hi"}], max_tokens=16, temperature=0,
                            seed=None)
    r = await stream_chat(session, url, payload, epoch=0.0)  # epoch 0: mono_start_ms is absolute
    assert r.ok and r.ttft_ms is not None and r.mono_start_ms is not None, r.error
    return _index(r.text), (r.mono_start_ms + r.ttft_ms) / 1000.0, len(r.chunk_offsets_ms), 1


_WIRE: dict[int, WireClient] = {}


async def evalkit_kernel_one(session: aiohttp.ClientSession, url: str) -> Measured:
    """evalkit's default path for plain http on Linux: each read's time from the kernel."""
    wire = _WIRE.setdefault(id(asyncio.get_running_loop()), WireClient())
    payload = build_payload("stub-model", [{"role": "user", "content": "hi"}], max_tokens=16, temperature=0,
                            seed=None)
    r = await stream_chat_wire(wire, url, payload, epoch=0.0)
    assert r.ok and r.ttft_ms is not None and r.mono_start_ms is not None, r.error
    assert r.timestamp_source == "kernel"
    # a first token that shared its read with later chunks carries the later receive time (the
    # ledger marks such rows timing_suspect when the loop lagged)
    return _index(r.text), (r.mono_start_ms + r.ttft_ms) / 1000.0, len(r.chunk_offsets_ms), r.first_read_chunks or 1


def make_vllm_one() -> Callable[[aiohttp.ClientSession, str], Awaitable[Measured]]:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    async def one(session: aiohttp.ClientSession, url: str) -> Measured:
        inp = RequestFuncInput(prompt="hi", api_url=url, prompt_len=1, output_len=16, model="stub-model")
        out = await async_request_openai_chat_completions(inp, session)
        assert out.success, out.error
        return _index(out.generated_text), out.start_time + out.ttft, len(out.itl) + 1, 1

    return one


async def drive(one: Callable[[aiohttp.ClientSession, str], Awaitable[Measured]], url: str, n: int,
                concurrency: int) -> tuple[list[Measured], float]:
    """n requests, at most `concurrency` in flight (n == concurrency: all started together)."""
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
    for w in _WIRE.values():
        w.close()
    _WIRE.clear()
    return out, cpu


def stamps(port: int) -> dict[int, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as r:
        return {int(k): v for k, v in json.loads(r.read())["stamps"].items()}


def measure(name: str, one: Callable, stub_args: list[str], n: int, concurrency: int, mode: str) -> dict[str, Any]:
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
    errs = sorted((arrival - sent[i]) * 1000 for i, arrival, _, _ in got)
    whole = sorted((arrival - sent[i]) * 1000 for i, arrival, _, first in got if first <= 1)
    chunks = sum(c for _, _, c, _ in got)
    return {"client": name, "mode": mode, "n": len(got), "concurrency": concurrency,
            "ttft_err_p50_ms": statistics.median(errs), "ttft_err_p99_ms": errs[int(0.99 * (len(errs) - 1))],
            "merged_first_reads": len(got) - len(whole),
            "ttft_err_p99_unmerged_ms": whole[int(0.99 * (len(whole) - 1))] if whole else None,
            "chunks": chunks, "cpu_s": cpu, "chunks_per_cpu_s": chunks / cpu if cpu else float("nan")}


def _cell(r: dict[str, Any]) -> str:
    text = f"{r['ttft_err_p50_ms']:.3f} / {r['ttft_err_p99_ms']:.3f}"
    if r["merged_first_reads"]:  # kernel stamps: the rows whose first token shared a read, and the rest's p99
        text += (f" ({r['merged_first_reads']} of {r['n']} first reads merged; the others' p99 "
                 f"{r['ttft_err_p99_unmerged_ms']:.3f})")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--max-streams", type=int, default=4096)
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})  # the client on core 0, the stub on core 1
    clients = {"evalkit (kernel stamps)": evalkit_kernel_one, "evalkit (user-space stamps)": evalkit_one,
               "vllm bench serve": make_vllm_one()}
    scale = 4 if a.quick else 1
    rows = []
    levels = [c for c in (1, 64, 256, 1024, 4096) if c <= a.max_streams]
    # Staggered: short replies, a 20 ms server-side TTFT, N streams in flight over many requests.
    for conc in levels:
        n = max(conc, {1: 200, 64: 1024, 256: 2048}.get(conc, 2 * conc) // scale)
        for name, one in clients.items():
            rows.append(measure(name, one, ["--ttft-ms", "20", "--itl-ms", "5", "--fixed-chunks", "8"], n, conc,
                                "staggered"))
            print(json.dumps(rows[-1]), flush=True)
    # Synchronized: N requests at once, 500 ms TTFT, 4 chunks 250 ms apart.
    for conc in [c for c in levels if c >= 64]:
        for name, one in clients.items():
            rows.append(measure(name, one, ["--ttft-ms", "500", "--itl-ms", "250", "--fixed-chunks", "4"], conc, conc,
                                "synchronized"))
            print(json.dumps(rows[-1]), flush=True)
    # Parse throughput: long replies sent as fast as the stub can (no sleeps), 16 streams.
    thr = []
    for name, one in clients.items():
        thr.append(measure(name, one, ["--ttft-ms", "0", "--itl-ms", "0", "--fixed-chunks", "2000"],
                           max(16, 128 // scale), 16, "throughput"))
        print(json.dumps(thr[-1]), flush=True)

    print("\n" + host_line(this_host()))
    print("\n| start | streams | " + " | ".join(f"{c} p50 / p99 (ms)" for c in clients) + " |")
    print("|---|---|" + "---|" * len(clients))
    for mode in ("staggered", "synchronized"):
        for conc in levels:
            cells = [next((r for r in rows if r["client"] == c and r["concurrency"] == conc and r["mode"] == mode), None)
                     for c in clients]
            if all(cells):
                print(f"| {mode} | {conc} | " + " | ".join(_cell(r) for r in cells) + " |")
    print("\n| client | content chunks parsed per CPU-second (one core) |")
    print("|---|---|")
    for r in thr:
        print(f"| {r['client']} | {r['chunks_per_cpu_s']:,.0f} |")
    ev, vl = thr[0]["chunks_per_cpu_s"], thr[2]["chunks_per_cpu_s"]
    print(f"\nparse throughput ratio evalkit (kernel) / vllm bench serve: {ev / vl:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
