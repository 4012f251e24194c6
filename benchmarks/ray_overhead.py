"""What `--ray` costs per request: the same stub, the same load (closed loop, concurrency 64),
sent by a local run and by a Ray task on a local Ray instance. With `--ray` the client runs in
the worker next to the server and rows stream back to the driver, so TTFT should not move.

    .venv/bin/python benchmarks/ray_overhead.py [--requests 640] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.client_overhead import free_port  # noqa: E402
from benchmarks.open_loop_rate import start_stub  # noqa: E402
from evalkit.execution.inputs import RunInputs  # noqa: E402
from evalkit.execution.load import load_from_options  # noqa: E402
from evalkit.execution.skeleton import run_matrix  # noqa: E402
from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.ledger import open_ledger  # noqa: E402
from evalkit.paths import default_dataset_path  # noqa: E402
from evalkit.spec.dataset import load_cases  # noqa: E402
from evalkit.spec.matrix import load_matrix  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    import ray

    work = Path(tempfile.mkdtemp(prefix="evalkit-rayoh-"))
    port = free_port()
    stub = start_stub(port)
    base = f"http://127.0.0.1:{port}"
    (work / "m.yaml").write_text(
        "name: ray-overhead\nbaseline: stub\ngeneration:\n  max_tokens: 8\n  structured_output: false\n"
        f"  warmup: 1\n  baseline_repeats: 1\nvariants:\n  - name: stub\n    endpoint: {base}\n")
    matrix = load_matrix(work / "m.yaml")
    cases = load_cases(default_dataset_path())[:128]
    reps = max(1, a.requests // len(cases))
    load = load_from_options(None, concurrency=a.concurrency)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    results: dict[str, list[float]] = {"local": [], "ray": []}
    walls: dict[str, float] = {}
    try:
        for rnd in range(2):  # alternate, twice: local, ray, local, ray
            for mode in ("local", "ray"):
                ledger = open_ledger(work / f"{mode}{rnd}.db")
                t0 = time.monotonic()
                s = run_matrix(ledger, RunInputs.of(matrix, cases, default_dataset_path(), repeats=reps, load=load,
                                                    ray_address="local" if mode == "ray" else None))
                walls[mode] = walls.get(mode, 0.0) + time.monotonic() - t0
                results[mode] += [r["ttft_ms"] for r in ledger.measured_requests(s.run_id, ok_only=True)]
    finally:
        ray.shutdown()
        stub.terminate()
        stub.wait()
    print(host_line(this_host()))
    print(f"{len(results['local'])} local and {len(results['ray'])} --ray requests, concurrency {a.concurrency}")
    print("| client | TTFT p50 (ms) | TTFT p99 (ms) | wall (s) |")
    print("|---|---|---|---|")
    for mode in ("local", "ray"):
        xs = sorted(results[mode])
        print(f"| {mode} | {statistics.median(xs):.2f} | {xs[int(0.99 * (len(xs) - 1))]:.2f} | {walls[mode]:.1f} |")
    d = statistics.median(results["ray"]) - statistics.median(results["local"])
    print(f"TTFT median, --ray minus local: {d:+.2f} ms (target: within 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
