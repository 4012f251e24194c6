"""What `--enable-per-request-metrics` costs the server: the same bundled model served twice,
one server with the flag and one without, both up at once and alternated case by case
(`--interleave`, greedy, the same cases and output lengths), so the machine's drift does not
favour one. Prints TTFT and TPOT medians per server and the paired difference (on − off).

    .venv/bin/python benchmarks/per_request_metrics.py [--cases 12] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.ledger import open_ledger  # noqa: E402

MATRIX = """name: per-request-metrics-cost
baseline: "off"
telemetry:
  per_request_metrics: false   # evalkit adds no flag; the "on" server gets it explicitly
generation:
  max_tokens: 64
  temperature: 0
  structured_output: false
  baseline_repeats: 1
  warmup: 1
  extra_body: {ignore_eos: true}
variants:
  - name: "off"
    model: bundled:smollm2-135m-instruct
    dtype: native
    vllm_args: [--max-model-len, "4096", --enforce-eager, --no-enable-prefix-caching]
  - name: "on"
    model: bundled:smollm2-135m-instruct
    dtype: native
    vllm_args: [--max-model-len, "4096", --enforce-eager, --no-enable-prefix-caching, --enable-per-request-metrics]
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalkit-prm-"))
    (work / "m.yaml").write_text(MATRIX)
    ledger_path = work / "l.db"
    cmd = [sys.executable, str(ROOT / "cli.py"), "run", "--matrix", str(work / "m.yaml"), "--limit", str(a.cases),
           "--repeats", str(a.repeats), "--interleave", "--ledger", str(ledger_path), "--no-grade", "-q"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        return 1
    ledger = open_ledger(ledger_path)
    run_id = ledger.latest_run_id()
    rows = [x for x in ledger.measured_requests(run_id, ok_only=True)]
    by = {v: {(x["case_id"], x["repeat"]): x for x in rows if x["variant"] == v} for v in ("off", "on")}
    print(host_line(this_host()))
    print(f"{a.cases} cases x {a.repeats} repeats per server, 64 output tokens (ignore_eos), greedy, interleaved")
    print("| server | n | TTFT p50 (ms) | TPOT p50 (ms) | E2E p50 (ms) | rows with server timing |")
    print("|---|---|---|---|---|---|")
    for v in ("off", "on"):
        xs = list(by[v].values())
        med = {k: statistics.median([x[k] for x in xs if x[k] is not None]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
        timed = sum(1 for x in xs if x["srv_method"] == "response")
        print(f"| {v} | {len(xs)} | {med['ttft_ms']:.1f} | {med['tpot_ms']:.2f} | {med['e2e_ms']:.0f} | {timed} |")
    keys = sorted(set(by["off"]) & set(by["on"]))
    out = {}
    for k in ("ttft_ms", "tpot_ms"):
        d = [100.0 * (by["on"][c][k] - by["off"][c][k]) / by["off"][c][k] for c in keys
             if by["on"][c][k] and by["off"][c][k]]
        out[k] = statistics.median(d)
        print(f"paired {k} (on − off): median {out[k]:+.1f} % over {len(d)} pairs")
    print(json.dumps({"run": run_id, "paired_median_pct": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
