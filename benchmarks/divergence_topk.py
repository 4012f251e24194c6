"""How much KL the top-k approximation misses (issue 26): the baseline's answers of a drift-control
run scored on each variant's server with a large k (vLLM started with `--max-logprobs K`), then
the divergence grader's KL recomputed from the same answers truncated to smaller k. The bucketed
KL can only grow with k (each step splits the tail bucket) towards the full-vocabulary KL.

One server at a time (the bundled models, 60-110 s to start each), every answer scored alone:

    python benchmarks/divergence_topk.py --ledger drift.db --run RUN [--k 100] [--cases 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path
from typing import Any

import aiohttp

from evalkit.engines.bundled import resolve_model
from evalkit.engines.vllm_server import VLLMServer
from evalkit.execution.scoring import baseline_answers
from evalkit.grading.token_kl import compare
from evalkit.host import host_line, this_host
from evalkit.ledger import open_ledger
from evalkit.measure.scoring import parse_prompt_logprobs, post_json, prefix_payload, scoring_payload, tokenize_count
from evalkit.paths import cache_dir
from evalkit.spec.matrix import Matrix
from evalkit.stats import mean

KS = (5, 10, 20, 50, 100, 200)


async def score_all(url: str, answers: list[dict[str, Any]], k: int) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    async with aiohttp.ClientSession() as http:
        for a in answers:
            msgs = json.loads(a["messages_json"])
            _, pre = await post_json(http, url + "/tokenize", prefix_payload("m", msgs), {}, 600, 0.0)
            _, data = await post_json(http, url + "/v1/chat/completions", scoring_payload("m", msgs, a["text"], k), {},
                                      600, 0.0)
            prefix = tokenize_count(pre)[0]
            out.append(parse_prompt_logprobs(data or {}, prefix or 0, k)[0])
    return out


def truncate(tok: dict[str, Any], k: int) -> dict[str, Any]:
    return {**tok, "top_ids": [t[:k] for t in tok["top_ids"]], "top_lp": [t[:k] for t in tok["top_lp"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", type=Path, required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--cases", type=int, default=12)
    a = ap.parse_args()
    db = open_ledger(a.ledger, create=False)
    run = db.require_run(a.run)
    matrix = Matrix.model_validate_json(run["matrix_json"])
    answers = baseline_answers(db, a.run, matrix.baseline)[: a.cases]
    scored: dict[str, list[dict[str, Any] | None]] = {}
    for v in matrix.ordered_variants():
        args = [*v.effective_vllm_args(), "--max-logprobs", str(a.k), "--kv-cache-memory-bytes", str(400 * 2**20)]
        with VLLMServer(resolve_model(v.model or ""), "m", args, cache_dir() / "logs" / f"topk-{v.name}.log",
                        cache_dir=cache_dir()) as s:
            asyncio.run(score_all(s.base_url, answers[:1], a.k))  # the first scoring request pays one-off costs
            scored[v.name] = asyncio.run(score_all(s.base_url, answers, a.k))
    base = scored[matrix.baseline]
    print(host_line(this_host()))
    print(f"\n{len(answers)} baseline answers of run {a.run}, scored alone with k = {a.k}; KL over the top-k buckets "
          "(nats per token, mean over cases) and the baseline's mass outside its top-k\n")
    ks = [k for k in KS if k <= a.k]
    print("| variant | " + " | ".join(f"KL k={k}" for k in ks) + " | " + " | ".join(f"tail k={k}" for k in ks) + " |")
    print("|---|" + "---|" * (2 * len(ks)))
    for name, toks in scored.items():
        if name == matrix.baseline:
            continue
        kl, tail = [], []
        for k in ks:
            per = [compare(truncate(b, k), truncate(c, k)) for b, c in zip(base, toks, strict=True) if b and c]
            kl.append(mean([mean(c.kl) for c in per]))
            tail.append(mean([mean([max(0.0, 1 - sum(math.exp(x) for x in lp[:k])) for lp in b["top_lp"]])
                              for b in base if b]))
        print(f"| {name} | " + " | ".join(f"{x:.4g}" for x in kl) + " | " + " | ".join(f"{100 * x:.1f} %" for x in tail)
              + " |")


if __name__ == "__main__":
    main()
