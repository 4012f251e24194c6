"""Write the small sample traces in data/traces/ (one per format evalkit replays), made up here,
deterministically: no download. Each keeps the shape of its public source (docs/traffic.md).

    python data/build_traces.py            # rewrite the samples
    python data/build_traces.py --check    # exit 1 if a committed sample is stale
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

DIR = Path(__file__).with_name("traces")
N = 40


def arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(round(t, 3))
        t += rng.expovariate(rate)
    return out


def lengths(rng: random.Random) -> tuple[int, int]:
    return rng.choice([180, 240, 320, 450, 600, 760, 900]), rng.choice([16, 24, 32, 48])


def mooncake() -> str:
    """Mooncake's trace shape: ms timestamps, lengths, 512-token hash blocks. Most requests start
    with the same two blocks (a long shared system prompt), as in the published traces."""
    rng = random.Random(1)
    rows = []
    for i, t in enumerate(arrivals(rng, N, 2.0)):
        inp, out = rng.choice([600, 900, 1100, 1300]), rng.choice([16, 24, 32])
        blocks = -(-inp // 512)
        shared = [0, 1] if i % 5 else [100 + i, 101 + i]  # 4 in 5 share a 1,024-token prefix
        ids = (shared + [1000 + i * 10 + k for k in range(blocks)])[:blocks]
        rows.append({"timestamp": int(t * 1000), "input_length": inp, "output_length": out, "hash_ids": ids})
    return "".join(json.dumps(r) + "\n" for r in rows)


def azure() -> str:
    """Azure's LLM inference trace shape: a datetime, context and generated tokens."""
    rng = random.Random(2)
    t0 = datetime(2024, 5, 10, 9, 0, 0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in arrivals(rng, N, 2.0):
        inp, out = lengths(rng)
        lines.append(f"{(t0 + timedelta(seconds=t)).isoformat(sep=' ', timespec='microseconds')}0,{inp},{out}")
    return "\n".join(lines) + "\n"


def burstgpt() -> str:
    """BurstGPT's shape: seconds, model, request and response tokens, total, log type."""
    rng = random.Random(3)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    t = 5.0
    for i in range(N):
        # bursts: three quick requests, then a pause
        t += rng.uniform(0.05, 0.2) if i % 4 else rng.uniform(1.5, 3.0)
        inp, out = lengths(rng)
        kind = "Conversation log" if i % 3 else "API log"
        lines.append(f"{t:.3f},ChatGPT,{inp},{out},{inp + out},{kind}")
    return "\n".join(lines) + "\n"


def evalkit() -> str:
    """Real requests as an OpenAI request log: offsets and messages (from the shipped dataset)."""
    rng = random.Random(4)
    cases = [json.loads(x) for x in Path(__file__).with_name("resume_gen_benchmark.jsonl").read_text().splitlines()]
    rows = []
    for i, t in enumerate(arrivals(rng, 12, 1.0)):
        c = cases[(i * 11) % len(cases)]
        rows.append({"id": f"log-{i:03d}", "offset_s": t, "messages": c["messages"], "max_tokens": 48})
    return "".join(json.dumps(r) + "\n" for r in rows)


FILES = {"mooncake_sample.jsonl": mooncake, "azure_sample.csv": azure, "burstgpt_sample.csv": burstgpt,
         "evalkit_sample.jsonl": evalkit}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    DIR.mkdir(exist_ok=True)
    stale = []
    for name, make in FILES.items():
        text, p = make(), DIR / name
        if a.check:
            if not p.exists() or p.read_text() != text:
                stale.append(p)
        else:
            p.write_text(text)
            print(f"wrote {p}")
    for p in stale:
        print(f"{p} is stale: run python data/build_traces.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
