"""Does "Poisson at R/s" arrive at R/s? evalkit's open loop vs vLLM's `bench serve`, same stub, same rate.

The stub server (its own process, pinned to the other core) records when each request reaches it,
so the achieved arrival rate is measured by the server, not by the client that claims it:
(n - 1) / (last arrival - first arrival). Both clients send the same number of requests at the
same requested Poisson rate; the stub answers in ~5 ms with 8 chunks.

    .venv/bin/python benchmarks/open_loop_rate.py [--rate 20] [--n 500]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import client_overhead  # noqa: E402
from benchmarks.client_overhead import free_port  # noqa: E402
from evalkit.engines.bundled import resolve_model  # noqa: E402
from evalkit.execution.inputs import RunInputs  # noqa: E402
from evalkit.execution.load import load_from_options  # noqa: E402
from evalkit.execution.skeleton import run_matrix  # noqa: E402
from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.ledger import open_ledger  # noqa: E402
from evalkit.paths import default_dataset_path  # noqa: E402
from evalkit.spec.dataset import load_cases  # noqa: E402
from evalkit.spec.matrix import load_matrix  # noqa: E402


def start_stub(port: int) -> subprocess.Popen[bytes]:
    """The stub on the other core: 5 ms to the first token, 8 chunks per reply."""
    return client_overhead.start_stub(port, "--fixed-chunks", "8", "--ttft-ms", "5")


def arrivals(base: str) -> list[float]:
    with urllib.request.urlopen(f"{base}/stats?reset=1", timeout=10) as r:
        return sorted(json.loads(r.read())["arrivals"])


def summary(xs: list[float]) -> tuple[float, float]:
    """(achieved requests/s, coefficient of variation of the gaps) from arrival times in seconds."""
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    return (len(xs) - 1) / (xs[-1] - xs[0]), statistics.pstdev(gaps) / statistics.fmean(gaps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--n", type=int, default=500)
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    work = Path(tempfile.mkdtemp(prefix="evalkit-openloop-"))
    port = free_port()
    stub = start_stub(port)
    base = f"http://127.0.0.1:{port}"
    try:
        cases = load_cases(default_dataset_path())
        # evalkit: --rate R through the library, no warm-up, the cases repeated up to n requests
        (work / "m.yaml").write_text(
            "name: open-loop\nbaseline: stub\ngeneration:\n  max_tokens: 8\n  structured_output: false\n"
            f"  warmup: 0\n  baseline_repeats: 1\nvariants:\n  - name: stub\n    endpoint: {base}\n")
        reps = -(-a.n // len(cases))
        sub = cases[: -(-a.n // reps)]  # reps x len(sub) = n (or just over)
        pick = sub * reps
        ledger = open_ledger(work / "l.db")
        load = load_from_options(None, rate=a.rate, arrival_seed=1)
        arrivals(base)
        t0 = time.monotonic()
        run_matrix(ledger, RunInputs.of(load_matrix(work / "m.yaml"), sub, default_dataset_path(), repeats=reps, load=load))
        ev_wall = time.monotonic() - t0
        ev = arrivals(base)
        rows = [r for r in ledger.measured_requests(ledger.latest_run_id())]
        sent = sorted(r["sent_ms"] for r in rows)
        ev_client = (len(sent) - 1) / ((sent[-1] - sent[0]) / 1000)

        # vLLM's bench serve: openai-chat backend, the same rate, Poisson (burstiness 1)
        with (work / "prompts.jsonl").open("w") as f:
            for c in pick:
                f.write(json.dumps({"prompt": c.messages[-1].content[:400]}) + "\n")
        tok = resolve_model("bundled:smollm2-135m-instruct")
        cmd = [sys.executable, str(ROOT / "benchmarks" / "vllm_cli.py"), "bench", "serve",
               "--backend", "openai-chat", "--base-url", base, "--endpoint", "/v1/chat/completions",
               "--model", "stub-model", "--tokenizer", tok, "--dataset-name", "custom",
               "--dataset-path", str(work / "prompts.jsonl"), "--custom-output-len", "8",
               "--num-prompts", str(len(pick)), "--request-rate", str(a.rate), "--burstiness", "1.0",
               "--seed", "1", "--disable-tqdm", "--save-result", "--result-dir", str(work),
               "--result-filename", "bench.json"]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        bench_wall = time.monotonic() - t0
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
            return 1
        bench = arrivals(base)
        b = json.loads((work / "bench.json").read_text())
    finally:
        stub.terminate()
        stub.wait()

    ev_rate, ev_cv = summary(ev)
    b_rate, b_cv = summary(bench)
    print(host_line(this_host()))
    print(f"requested: Poisson at {a.rate:g}/s, {len(ev)} (evalkit) and {len(bench)} (bench serve) requests; "
          f"wall {ev_wall:.1f} s / {bench_wall:.1f} s")
    print("| client | achieved rate at the server (req/s) | vs requested | gaps' CV | client's own figure |")
    print("|---|---|---|---|---|")
    print(f"| evalkit `--rate` | {ev_rate:.2f} | {100 * (ev_rate / a.rate - 1):+.1f} % | {ev_cv:.2f} | "
          f"send rate {ev_client:.2f}/s |")
    print(f"| `vllm bench serve --request-rate` | {b_rate:.2f} | {100 * (b_rate / a.rate - 1):+.1f} % | {b_cv:.2f} | "
          f"request_throughput {b['request_throughput']:.2f}/s |")
    print(f"evalkit / bench serve achieved-rate ratio: {ev_rate / b_rate:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
