"""Kill every command that writes a ledger (or a file made from one) at random moments (issue 45).

The soak (benchmarks/soak.py) kills `evalkit run`; this kills the others, each with SIGKILL at a
seeded moment spread over the time the same command takes unkilled:
  merge    `evalkit ledger merge A B -o OUT`        OUT absent or whole; the inputs untouched
  grade    `evalkit grade --grader schema`           grades written whole (one transaction a batch)
  migrate  `evalkit ledger migrate` of an old ledger each migration whole (one transaction each)
  publish  `evalkit publish --out DIR`               DIR absent or whole (built beside, renamed)
  report   `evalkit report` (its derived tables)     derived tables replaced in one transaction
  copy     `evalkit ledger copy A OUT`               OUT absent or whole
After each kill: every SQLite file in the folder passes `PRAGMA integrity_check` in another
process, nothing half-written stands under a final name, and the same command run again completes.

    .venv/bin/python benchmarks/kill_points.py --kills 8 --json     # what tests/test_kill_points.py runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.ledger import copy_ledger  # noqa: E402

EVALKIT = [str(Path(sys.executable).with_name("evalkit"))]
LEGACY = ROOT / "tests" / "fixtures" / "ledger_m004.db"
PUBLISHED = ("README.md", "requests", "runs", "variants")  # what a whole --out folder holds at least


def integrity(path: Path) -> str:
    """SQLite's integrity check from a fresh process (a stranger's view of the file)."""
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "print('; '.join(r[0] for r in c.execute('pragma integrity_check'))); c.close()")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else r.stderr.strip().splitlines()[-1]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as c:
        return c.execute(f"select count(*) from [{table}]").fetchone()[0]


@dataclass
class Case:
    """One command to kill: how to set up a fresh try, its arguments, and what must hold after."""

    name: str
    setup: Callable[[Path], dict[str, Any]]
    args: Callable[[dict[str, Any]], list[str]]
    whole: Callable[[dict[str, Any]], str | None]  # None when what it wrote is whole (or absent)


def build_source(work: Path) -> Path:
    """A run of 144 cases x 2 variants against stub servers, ungraded: what every case starts from."""
    from benchmarks.scale import free_port, wait_http

    src = work / "source.db"
    ports = [free_port(), free_port()]
    stubs = [subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(p), "--ttft-ms", "1",
                               "--itl-ms", "0"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in ports]
    try:
        for p, s in zip(ports, stubs, strict=True):
            wait_http(f"http://127.0.0.1:{p}/health", 30, s)
        m = work / "matrix.yaml"
        m.write_text("name: kill\nbaseline: base\ngeneration:\n  warmup: 0\n  max_tokens: 48\nvariants:\n"
                     + "".join(f"  - name: {n}\n    endpoint: http://127.0.0.1:{p}\n" for n, p in zip(("base", "cand"),
                                                                                                  ports, strict=True)))
        r = subprocess.run([*EVALKIT, "run", "--matrix", str(m), "--ledger", str(src), "-q", "--no-grade",
                            "--concurrency", "8", "--repeats", "2"], cwd=work, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"building the source ledger failed: {r.stderr[-1000:]}")
    finally:
        for s in stubs:
            s.terminate()
            s.wait(10)
    return src


def cases(src: Path) -> list[Case]:
    def fresh(try_dir: Path) -> dict[str, Any]:
        return {"dir": try_dir, "ledger": copy_ledger(src, try_dir / "l.db")}

    def merge_setup(d: Path) -> dict[str, Any]:
        a, b = copy_ledger(src, d / "a.db"), copy_ledger(src, d / "b.db")
        return {"dir": d, "a": a, "b": b, "out": d / "out.db", "sha": (sha(a), sha(b))}

    def merge_whole(s: dict[str, Any]) -> str | None:
        if (sha(s["a"]), sha(s["b"])) != s["sha"]:
            return "an input changed"
        if s["out"].exists() and rows(s["out"], "requests") != rows(s["a"], "requests"):
            return f"out has {rows(s['out'], 'requests')} requests, not the merge's {rows(s['a'], 'requests')}"
        return None

    def published_whole(s: dict[str, Any]) -> str | None:
        out = s["dir"] / "pub"
        if out.exists() and not all((out / x).exists() for x in PUBLISHED):
            return f"{out} holds {sorted(p.name for p in out.iterdir())}: not a whole publish"
        return None

    def copy_whole(s: dict[str, Any]) -> str | None:
        out = s["dir"] / "copy.db"
        if out.exists() and rows(out, "requests") != rows(s["ledger"], "requests"):
            return "a partial copy under the final name"
        return None

    def migrate_setup(d: Path) -> dict[str, Any]:
        return {"dir": d, "ledger": copy_ledger(LEGACY, d / "old.db")}

    return [
        Case("merge", merge_setup, lambda s: ["ledger", "merge", str(s["a"]), str(s["b"]), "-o", str(s["out"])],
             merge_whole),
        Case("grade", fresh, lambda s: ["grade", "--grader", "schema", "--ledger", str(s["ledger"])], lambda s: None),
        Case("migrate", migrate_setup, lambda s: ["ledger", "migrate", "--ledger", str(s["ledger"])], lambda s: None),
        Case("publish", fresh, lambda s: ["publish", "--ledger", str(s["ledger"]), "--out", str(s["dir"] / "pub")],
             published_whole),
        Case("report", fresh, lambda s: ["report", "--ledger", str(s["ledger"]), "--json"], lambda s: None),
        Case("copy", fresh, lambda s: ["ledger", "copy", str(s["ledger"]), str(s["dir"] / "copy.db")], copy_whole),
    ]


def databases(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*.db")) if not p.name.startswith(".")]


def one(case: Case, work: Path, k: int, delay_s: float | None) -> dict[str, Any]:
    """A fresh try of a command, killed after ``delay_s`` (None: not killed), then checked and run again."""
    d = work / f"{case.name}-{k}"
    d.mkdir()
    s = case.setup(d)
    t0 = time.monotonic()
    p = subprocess.Popen([*EVALKIT, *case.args(s)], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed_mid = False
    if delay_s is not None:
        try:
            p.wait(delay_s)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            killed_mid = True
    _, err = p.communicate()
    took = time.monotonic() - t0
    out: dict[str, Any] = {"command": case.name, "try": k, "delay_s": delay_s, "killed_mid_command": killed_mid,
                           "took_s": round(took, 3), "rc": p.returncode}
    if delay_s is None and p.returncode != 0:
        out["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"
    out["damaged"] = {str(f.relative_to(work)): why for f in databases(d) if (why := integrity(f)) != "ok"}
    out["half_written"] = case.whole(s)
    again = subprocess.run([*EVALKIT, *case.args(s)], cwd=d, capture_output=True, text=True) if killed_mid else None
    out["rerun_rc"] = again.returncode if again is not None else None
    if again is not None and again.returncode != 0:
        # a merge or copy killed after its rename already made OUT: the rerun refuses it, as it must
        finished = case.name in ("merge", "copy") and "exists" in again.stderr and case.whole(s) is None
        out["rerun_rc"] = 0 if finished else again.returncode
        out["rerun_error"] = None if finished else again.stderr.strip().splitlines()[-1]
    out["damaged_after_rerun"] = {str(f.relative_to(work)): why for f in databases(d) if (why := integrity(f)) != "ok"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=8, help="kills per command")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="comma-separated commands (merge,grade,migrate,publish,report,copy)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = a.work or Path(tempfile.mkdtemp(prefix="evalkit-kill-"))
    work.mkdir(parents=True, exist_ok=True)
    src = build_source(work)
    results: list[dict[str, Any]] = []
    for case in cases(src):
        if a.only and case.name not in a.only.split(","):
            continue
        base = one(case, work, 0, None)  # unkilled: how long it takes, and that it works
        results.append(base)
        for k in range(1, a.kills + 1):
            # stratified over the command's own time, its start-up (imports) included: kill k lands at a
            # random moment of the k-th of `kills` equal stretches of it, so each try hits another phase
            results.append(one(case, work, k, rng.uniform(k - 1, k) / a.kills * base["took_s"]))
        print(f"{case.name}: unkilled {base['took_s']:.2f} s; "
              f"{sum(r['killed_mid_command'] for r in results if r['command'] == case.name)} of {a.kills} kills "
              "landed before it ended", file=sys.stderr)
    held = {
        "every command runs unkilled": all(r.get("error") is None for r in results if r["delay_s"] is None),
        "no damaged file after a kill": all(not r["damaged"] for r in results),
        "nothing half-written under a final name": all(r["half_written"] is None for r in results),
        "a rerun completes": all(r["rerun_rc"] in (None, 0) for r in results),
        "no damaged file after the rerun": all(not r["damaged_after_rerun"] for r in results),
    }
    summary = {"host": host_line(this_host()), "seed": a.seed, "held": held,
               "landed": {c: sum(r["killed_mid_command"] for r in results if r["command"] == c)
                          for c in dict.fromkeys(r["command"] for r in results)},
               "results": results}
    for k, v in held.items():
        print(f"{'held' if v else 'BROKE'}: {k}", file=sys.stderr)
    if a.json:
        print(json.dumps(summary))
    return 0 if all(held.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
