"""How fast the command line starts: the median wall time (and peak RSS) of `evalkit --help` and
`evalkit report --help`, each run in a fresh process, and which heavy libraries the start loaded.

    .venv/bin/python benchmarks/cli_start.py            # 5 runs of each
    .venv/bin/python benchmarks/cli_start.py --runs 11

The library loads in the commands that use it (issue 37): the goal is under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402

EVALKIT = str(Path(sys.executable).with_name("evalkit"))
HEAVY = ("scipy", "numpy", "sqlite_utils", "aiohttp", "datasets", "torch", "sentence_transformers", "jsonschema",
         "pydantic", "rich", "yaml")
# what the start imported, printed by a child that renders the help in-process
PROBE = ("import sys\nfrom click.testing import CliRunner\nfrom evalkit.cli import cli\n"
         "for args in (['--help'], ['report', '--help']):\n    CliRunner().invoke(cli, args)\n"
         f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n")


def once(args: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (KB) and CPU seconds (user + system: what a busy machine does not
    inflate) of one `evalkit ARGS` in a new process."""
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-v", EVALKIT, *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"evalkit {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", p.stderr))
    return wall, int(m.group(1)) if m else 0, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    out: dict[str, object] = {"host": host_line(this_host())}
    for name, args in (("help", ["--help"]), ("report_help", ["report", "--help"])):
        once(args)  # the first start also reads the files from disk: not what a user waits for twice
        runs = [once(args) for _ in range(a.runs)]
        out[f"{name}_median_s"] = statistics.median(w for w, _, _ in runs)
        out[f"{name}_max_s"] = max(w for w, _, _ in runs)
        out[f"{name}_cpu_median_s"] = statistics.median(c for _, _, c in runs)
        out[f"{name}_rss_mb"] = max(kb for _, kb, _ in runs) / 1024
    loaded = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    out["heavy_loaded"] = loaded.stdout.split()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
