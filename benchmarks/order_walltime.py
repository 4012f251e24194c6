"""What alternation costs (issue 47): the embedded default on real vLLM with the variants one after
the other (`--order sequential`) and alternated (`--order alternate`, both servers up), the same
cases and seeds, on this machine. Prints each run's wall time, their ratio (the issue's bar: within
15 %), and each order's verdict lines and A/A control, naming the processor.

    .venv/bin/python benchmarks/order_walltime.py --limit 12 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402

EVALKIT = str(Path(sys.executable).with_name("evalkit"))


def one(order: str, limit: int, work: Path) -> dict:
    ledger = work / f"{order}.db"
    t0 = time.monotonic()
    r = subprocess.run([EVALKIT, "run", "--limit", str(limit), "--order", order, "--ledger", str(ledger)],
                       cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"--order {order} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    rep = json.loads(subprocess.run([EVALKIT, "report", "--ledger", str(ledger), "--json"], cwd=ROOT,
                                    capture_output=True, text=True).stdout)
    f = rep["findings"]
    return {"order": order, "wall_s": round(wall, 1), "verdict_lines": f["verdict_lines"],
            "headline": f["timeshare"]["headline"], "load": f["timeshare"]["lines"],
            "stages": {v["name"]: v.get("ready_s") for v in rep["variants"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalkit-order-"))
    runs = [one(order, a.limit, work) for order in ("sequential", "alternate")]
    ratio = runs[1]["wall_s"] / runs[0]["wall_s"]
    out = {"host": host_line(this_host()), "limit": a.limit, "runs": runs, "alternate_over_sequential": round(ratio, 3)}
    print(out["host"])
    for r in runs:
        print(f"--order {r['order']}: {r['wall_s']:.0f} s")
        for line in r["verdict_lines"] + r["headline"] + r["load"]:
            print(f"  {line}")
    print(f"alternate / sequential wall time: {ratio:.3f} ({'within' if ratio <= 1.15 else 'beyond'} the 15 % bar)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
