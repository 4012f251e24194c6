"""Per-case values of a real run, for the verdict simulation's `real` shape
(`evalkit.testing.verdict_sim`): each case's E2E and TTFT on both variants (repeats averaged), its
drift and noise floor, and its teacher-forced KL and batching floor, read through the same code the
verdicts use. The simulation resamples these cases and shifts them to the margin, so the verdicts
are proven on the shapes a real ledger has, not only on drawn ones.

    python benchmarks/real_per_case.py --ledger evalkit.db [--run ID] [--candidate w8a8]

Writes evalkit/testing/real_per_case.json (small: one record per case) with the run, host and
processor it came from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evalkit.grading.registry import available
from evalkit.ledger import open_ledger
from evalkit.reporting.pairing import latency_pairs
from evalkit.reporting.rows import request_rows
from evalkit.reporting.verdicts import grader_values, shared_repeats

OUT = Path(__file__).resolve().parents[1] / "evalkit" / "testing" / "real_per_case.json"


def grader_pairs(rows: list, baseline: str, cand: str, grader: str, metric: str) -> dict[str, tuple[float, float]]:
    """case -> (candidate's value, baseline's value) of one grader margin, as the verdicts read them."""
    if grader not in available():
        return {}
    agg = available()[grader].aggregate
    a = agg.margin_values(grader_values(rows, cand, grader), baseline_side=False).get(metric, {})
    b = agg.margin_values(grader_values(rows, baseline, grader), baseline_side=True).get(metric, {})
    return {c: (float(a[c]), float(b[c])) for c in sorted(set(a) & set(b))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", type=Path, required=True)
    ap.add_argument("--run", default=None)
    ap.add_argument("--candidate", default=None, help="default: the first variant that is not the baseline")
    a = ap.parse_args()
    db = open_ledger(a.ledger)
    run_id = a.run or db.latest_run_id()
    run = db.require_run(run_id)
    baseline = run.matrix["baseline"]
    rows = request_rows(db, run_id)
    cand = a.candidate or sorted({r["variant"] for r in rows} - {baseline})[0]
    reps = shared_repeats(rows, baseline, cand)
    out: dict[str, list] = {}
    for field in ("e2e_ms", "ttft_ms"):
        c, b, _ = latency_pairs(rows, baseline, cand, field, False, reps)
        out[field] = [[round(x, 3), round(y, 3)] for x, y in zip(c, b, strict=True)]
    for grader, metric in (("drift", "drift"), ("divergence", "kl")):
        out[metric] = [[round(x, 6), round(y, 6)] for x, y in grader_pairs(rows, baseline, cand, grader, metric).values()]
    host = db.host(run.get("host_id")) or {}
    doc = {"source": {"run": run_id, "matrix": run.matrix.get("name"), "baseline": baseline, "candidate": cand,
                      "processor": host.get("cpu_model"), "note": "[candidate, baseline] per case"}, **out}
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items())  # one line a field
    OUT.write_text("{\n" + body + "\n}\n", encoding="utf-8")
    print(f"{OUT}: " + ", ".join(f"{k} {len(v)} cases" for k, v in out.items()))


if __name__ == "__main__":
    main()
