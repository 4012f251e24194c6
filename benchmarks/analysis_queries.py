"""The report's named ledger queries (`evalkit/ledger/analysis.py`, `level_reads.py`, `case_reads.py`;
issue 48) timed at any size: each
query in a fresh process (its wall time, and the peak RSS of the ledger's query worker, where DuckDB
runs, and of the calling process), on synthesized ledgers
(`benchmarks/synth_ledger.py`: two variants at concurrency 1 and 4). The ratio column is each
query's time against its time at the smallest size, in this one run.

    .venv/bin/python benchmarks/analysis_queries.py --ledgers /tmp/s100k.db,/tmp/s1m.db,/tmp/s10m.db
    .venv/bin/python benchmarks/analysis_queries.py --sizes 100000,1000000 --dir /tmp/bench

A ledger named by --ledgers is used as it is; --sizes synthesizes the missing ones into --dir.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402

QUERIES = {
    "slice_table": "db.slice_table(rid, base, run.repeats, [m for m in REPORT if m.agg], {'ttft': 2000.0})",
    "distributions": "db.distributions(rid, base, run.repeats, ['complexity'], list(named('summary').values()))",
    "distributions --by persona": "db.distributions(rid, base, run.repeats, ['persona'], list(named('summary').values()))",
    "spike_rows ttft": "list(db.spike_rows(rid, 'ttft_ms', 3.5))",
    "case_pairs e2e": "db.case_pairs(rid, base, run.repeats, 'e2e_ms')",
    "client_lag_p99": "db.client_lag_p99(rid)",
    "level_table": "db.level_table(rid, {'ttft': 2000.0}, {'e2e': 2.0}, ('schema', 'persona', 'formality'))",
    "level_series (over-saturation's points)": "db.level_series(rid, thinned)",
    "level_usage": "db.level_usage(rid, 0.9)",
    "traffic_sums": "db.traffic_sums(rid)",
    "load_quality (quality under load)": "db.load_quality(rid, 'c=1', margins())",
    "flip_counts": "db.flip_counts(rid, base, ['schema', 'persona', 'accuracy'])[0]",
    "flip_counts --by persona": "db.flip_counts(rid, base, ['schema', 'persona', 'accuracy'], ['persona'], run.repeats)[0]",
    "first_answers (comparison view)": "db.first_answers(rid)",
    "pair_inputs (the verdicts' pairs)": "db.pair_inputs(rid, pairs(), latency=[('ttft_ms', False), ('e2e_ms', False)], "
                                         "margins=margins(), flips=['schema'])",
    "aa_cases e2e (the A/A control)": "db.aa_cases(rid, 'e2e_ms', base, run.repeats)[2]",
    "position_groups (the position effect)": "db.position_groups(rid)",
    "grader_summaries (the quality table)": "db.grader_summaries(rid, base, run.repeats, summaries())[0]",
    "grade_failure_counts (the graders' failures)": "db.grade_failure_counts(rid)",
    "reviewable_pairs (the reviews' pairs)": "[db.reviewable_pairs(rid, base)]",
    "chart_series (the HTML report's charts)": "[len(db.chart_series(rid, [base], [], {'formality': 'formality'}, "
                                               "True, 2000, 40, 3).cdf)]",
}
CHILD = """
import json, resource, sys, time
from evalkit.catalogue import REPORT, named
from evalkit.execution.stops import thinned
from evalkit.ledger import open_ledger
db = open_ledger(sys.argv[1], create=False)
run = db.require_run(None)
rid, base = run["id"], db.baseline(run["id"])


def margins():
    from evalkit.grading.base import declared_case_values
    from evalkit.grading.registry import available
    return [(n, m, v, declared_case_values(c, True)[m]) for n, c in available().items() if c.aggregate.margins
            for m, v in declared_case_values(c, False).items()]


def pairs():
    levels = db.slice_levels(rid)
    return [(base, min(levels[base]), v, min(levels[v])) for v in sorted(levels) if v != base]


def summaries():
    from evalkit.grading.base import declared_summary
    from evalkit.grading.registry import available
    return {{g: s for g in sorted(db.measured_graders(rid)) if g in available()
            and (s := declared_summary(available()[g])) is not None}}


t0, c0 = time.perf_counter(), time.process_time()
got = {expr}
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
worker_mb = db._worker.peak_kb / 1024 if db._worker else 0.0
db.close()
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_mb": worker_mb, "rows_out": len(got)}}))
"""


def rows_of(path: Path) -> int:
    out = subprocess.run([sys.executable, "-c", "import sys\nfrom evalkit.ledger import open_ledger\n"
                          "db = open_ledger(sys.argv[1], create=False)\nrid = db.require_run(None)['id']\n"
                          "print(db.query('select count(*) from l.measured where run_id = $run', {'run': rid})[1][0][0])"
                          "\ndb.close()", str(path)], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ledgers", default="", help="comma-separated synthesized ledgers, smallest first")
    ap.add_argument("--sizes", default="", help="comma-separated row counts to synthesize into --dir")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/evalkit-analysis-bench"))
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    ap.add_argument("--only", default="", help="the queries whose name contains this text")
    args = ap.parse_args()
    ledgers = [Path(p) for p in args.ledgers.split(",") if p]
    for n in [int(x) for x in args.sizes.split(",") if x]:
        path = args.dir / f"synth-{n}.db"
        if not path.exists():
            args.dir.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "synth_ledger.py"), str(path), "--rows", str(n),
                            "--levels", "1,4", "--variants", "base,w8a8"], check=True, cwd=ROOT)
        ledgers.append(path)
    print(host_line(this_host()))
    results = []
    first: dict[str, float] = {}
    print("| rows | query | wall s | query worker peak RSS MB | caller peak RSS MB | time vs smallest |")
    print("|---|---|---|---|---|---|")
    for path in ledgers:
        n = rows_of(path)
        for name, expr in QUERIES.items():
            if args.only not in name:
                continue
            out = subprocess.run([sys.executable, "-c", CHILD.format(expr=expr), str(path)], capture_output=True,
                                 text=True, cwd=ROOT)
            if out.returncode:
                print(f"| {n:,} | {name} | failed: {out.stderr.strip().splitlines()[-1]} | | | |")
                continue
            r = json.loads(out.stdout)
            first.setdefault(name, r["wall_s"])
            results.append({"rows": n, "query": name, **r})
            print(f"| {n:,} | {name} | {r['wall_s']:.2f} | {r['worker_mb']:.0f} | {r['peak_mb']:.0f} | "
                  f"{r['wall_s'] / first[name]:.1f}x |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"host": host_line(this_host()), "results": results}, indent=2))


if __name__ == "__main__":
    main()
