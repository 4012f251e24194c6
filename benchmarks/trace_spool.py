"""What a long trace costs in memory before it is sent: `trace_cases` spools the cases to disk
(`evalkit.spec.spool`) against the same cases held as a list (what a run held before), at two
sizes, each in a fresh process (peak RSS from getrusage).

    python benchmarks/trace_spool.py --sizes 20000,200000 --prompt-chars 2000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import resource, sys, time
from evalkit.execution.traces import TraceSpec, trace_cases
from evalkit.spec.matrix import Matrix
m = Matrix.model_validate({"name": "m", "baseline": "a", "variants": [
    {"name": "a", "endpoint": "http://127.0.0.1:9"}, {"name": "b", "endpoint": "http://127.0.0.1:9"}]})
t = time.perf_counter()
cases, offsets, _ = trace_cases(TraceSpec(sys.argv[1], "evalkit"), m)
if sys.argv[2] == "list":
    cases = list(cases)
n = sum(len(c.messages[0].content) > 0 for c in cases)  # one pass, as each variant's sends make
print(n, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def write_trace(path: Path, n: int, chars: int) -> None:
    words = ("experience leading teams across product launches and hiring " * (chars // 60 + 1))[:chars]
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"offset_s": i * 0.01, "max_tokens": 64,
                                "messages": [{"role": "user", "content": f"{i}: {words}"}]}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,200000")
    ap.add_argument("--prompt-chars", type=int, default=2000)
    a = ap.parse_args()
    print("| rows | trace file | cases | build + one pass | peak RSS |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for n in map(int, a.sizes.split(",")):
            trace = Path(d) / f"t{n}.jsonl"
            write_trace(trace, n, a.prompt_chars)
            for how in ("spooled", "list"):
                out = subprocess.run([sys.executable, "-c", CHILD, str(trace), how], capture_output=True, text=True,
                                     check=True).stdout.split()
                print(f"| {n:,} | {trace.stat().st_size / 1e6:.0f} MB | {how} | {float(out[1]):.1f} s | "
                      f"{int(out[2]):,} MB |", flush=True)


if __name__ == "__main__":
    main()
