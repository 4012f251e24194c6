"""Grading throughput on this machine: generations graded per second by schema, persona (rules +
embedding similarity), formality and drift (embeddings), excluding any LLM judge. Target: >= 50/s.

Peer, in the same run: computing only the embeddings the graders need, with sentence-transformers
directly. The ratio shows how much evalkit's rule and bookkeeping work adds on top of them.

    .venv/bin/python benchmarks/grading_throughput.py [--n 400]
    .venv/bin/python benchmarks/grading_throughput.py --scaling   # one core, every core, --ray

--scaling grades the same generations with the default embeddings three ways, each in a fresh
process: pinned to one core (the per-core figure), on every core, and with the embeddings on Ray
workers (`evalkit run --ray` grading: a local Ray instance, one CPU per task), and prints the
table with the speed-up over one core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.grading import GradedRequest, make_graders  # noqa: E402
from evalkit.grading.embeddings import encode_batch  # noqa: E402
from evalkit.grading.text import prose  # noqa: E402
from evalkit.spec.dataset import load_cases  # noqa: E402

WORDS = ("I build reliable payment systems with Python and Go and would welcome a short call about the role "
         "at your company next week to discuss how my PostgreSQL and Kafka work could help the team").split()


def synthetic_output(case, rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 110)))
    ctx = case.get("context_keys") or {}
    if case.schema_name == "outreach_email":
        return json.dumps({"subject": f"{ctx.get('role')} at {ctx.get('company')}"[:80],
                           "body": f"Dear reader, {body}.", "sign_off": "Best regards"})
    return json.dumps({"headline": f"{ctx.get('role')}"[:100], "summary": body[:590],
                       "skills": (ctx.get("skills") or [])[:4]})


def workload(n: int) -> tuple[list, dict[int, int]]:
    rng = random.Random(0)
    cases = load_cases()
    items, repeats = [], {}
    rid = 0
    for i in range(n):
        c = cases[i % len(cases)]
        for variant, rep in (("bf16", 0), ("bf16", 1), ("w8a8", 0)):
            rid += 1
            items.append(GradedRequest(rid, variant, synthetic_output(c, rng), "stop", c.model_copy(
                update={"id": f"{c.id}#{i}"})))
            repeats[rid] = rep
    return items, repeats


def one_mode(mode: str, n: int) -> dict:
    """Grade the workload once in this process: `one` (pinned to one core), `all`, or `ray`."""
    if mode == "one":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before any thread pool exists
    from evalkit.grading import GraderContext
    from evalkit.grading.embeddings import make_embed

    items, repeats = workload(n)
    if mode == "ray":
        from evalkit.execution.cluster import ray_embed

        embed = ray_embed("local")
        embed([f"warm up worker {i} " + " ".join(WORDS[:i % 20]) for i in range(2048)])  # every worker loads the model
        workers = int(__import__("ray").cluster_resources().get("CPU", 0))
    else:
        embed = make_embed(encode_batch)
        embed(["warm up the model"])
        workers = 1
    graders = make_graders(["schema", "persona", "formality", "drift"], GraderContext(embed=embed))
    t0 = time.perf_counter()
    for g in graders:
        if g.kind == "request":
            g.grade_batch(items)
        else:
            g.grade_outputs(items, repeats, "bf16")
    total = time.perf_counter() - t0
    return {"mode": mode, "n": len(items), "s": total, "per_s": len(items) / total,
            "cores": 1 if mode == "one" else len(os.sched_getaffinity(0)), "ray_cpus": workers if mode == "ray" else None}


def scaling(n: int) -> int:
    from evalkit.host import host_line, this_host

    print(host_line(this_host()))
    out = []
    for mode in ("one", "all", "ray"):
        p = subprocess.run([sys.executable, __file__, "--mode", mode, "--n", str(n)], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{mode}: failed: {p.stderr.strip().splitlines()[-1:]}")
            continue
        out.append(json.loads(p.stdout.strip().splitlines()[-1]))
    base = next((r["per_s"] for r in out if r["mode"] == "one"), None)
    names = {"one": "one core (pinned)", "all": "every core, one process", "ray": "--ray (embeddings on Ray workers)"}
    print("| grading | cores | generations | s | generations/s | per core | vs one core |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        print(f"| {names[r['mode']]} | {r['cores']} | {r['n']:,} | {r['s']:.1f} | {r['per_s']:,.0f} | "
              f"{r['per_s'] / r['cores']:,.0f} | {r['per_s'] / base if base else float('nan'):.2f}x |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="generations per variant (two variants + a floor repeat)")
    ap.add_argument("--scaling", action="store_true", help="one core, every core and --ray, each in its own process")
    ap.add_argument("--mode", choices=("one", "all", "ray"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(one_mode(a.mode, a.n)))
        return 0
    if a.scaling:
        return scaling(a.n)
    items, repeats = workload(a.n)
    from evalkit.grading import GraderContext
    from evalkit.grading.embeddings import _onnx_session, encode_torch, make_embed
    from evalkit.host import host_line, this_host

    print(host_line(this_host()))
    encode_torch(["warm up the model"])  # load once, outside the timing
    _onnx_session()  # export (first use) and verify, outside the timing
    n = len(items)
    results = {}
    for name, encode in (("torch (reference)", encode_torch), ("onnxruntime (default)", encode_batch)):
        graders = make_graders(["schema", "persona", "formality", "drift"], GraderContext(embed=make_embed(encode)))
        t0 = time.perf_counter()
        per = {}
        for g in graders:
            t = time.perf_counter()
            if g.kind == "request":
                g.grade_batch(items)
            else:
                g.grade_outputs(items, repeats, "bf16")
            per[g.name] = time.perf_counter() - t
        total = time.perf_counter() - t0
        results[name] = total
        print(f"{name}: {n} generations graded by schema + persona + formality (both estimators) + drift in "
              f"{total:.2f} s: {n / total:,.0f} generations/s (target >= 100/s)")
        for k, v in per.items():
            print(f"  {k:10s} {v:6.2f} s  ({n / v:,.0f}/s)")
    # peer: sentence-transformers alone encoding the distinct texts the graders need (every output
    # once, every persona description once), with no evalkit code around it
    texts = list(dict.fromkeys([prose(i.text) for i in items] + [i.case.persona_description for i in items]))
    t = time.perf_counter()
    encode_torch(texts)
    peer = time.perf_counter() - t
    print(f"peer: sentence-transformers embeddings alone for the same work: {peer:.2f} s ({n / peer:,.0f}/s)")
    print("speed-up of the default over the torch reference: "
          f"{results['torch (reference)'] / results['onnxruntime (default)']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
