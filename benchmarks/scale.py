"""How evalkit grows with the rows of one run: send N requests to the stub server (pinned to one
core, evalkit to the other), then time `report`, `report --json`, `report --html` and `browse`
(first page, the requests page with its facets, the canned queries) on the ledger it wrote.

Prints one table row per size and the growth ratio of each step from one size to the next (10x
the rows should cost at most about 10x the time, and the run's peak RSS should barely move).

    .venv/bin/python benchmarks/scale.py                       # 10k and 100k
    .venv/bin/python benchmarks/scale.py --sizes 10000,1000000 # the issue's check (about 35 min)
    .venv/bin/python benchmarks/scale.py --sizes 2000 --keep /tmp/scale   # keep the ledgers

The workload is the default dataset repeated (`--repeats`), two endpoint variants on the same
stub (`--ttft-ms 20 --itl-ms 2 --fixed-chunks 16`), concurrency 256, `--no-grade`, teacher-forced
scoring off (it costs the same per case at any size), `--quiet` (the report is timed on its own).

`--synth` writes each ledger with benchmarks/synth_ledger.py instead (three variants, a sweep of
three levels, grades, spikes of each cause; no server, a million rows in a minute or two), so the
report can be measured at sizes no run here reaches; `--no-browse` leaves Datasette out:

    .venv/bin/python benchmarks/scale.py --synth --no-browse --sizes 200000,2000000

`--ledger FILE` times only Datasette on a ledger already written (the front page, the requests
page, every canned query, the run's comparison list `/-/compare`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.host import host_line, this_host  # noqa: E402

EVALKIT = [str(Path(sys.executable).with_name("evalkit"))]
N_CASES = 144  # data/resume_gen_benchmark.jsonl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> float:
    """Seconds until ``url`` answers 200."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode}) before it answered")
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                r.read()
                return time.monotonic() - t0
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


def get_s(url: str) -> tuple[float, int]:
    """Seconds one GET takes, and its status."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=600) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    return time.monotonic() - t0, status


def tree_kb(root: int) -> int:
    """Resident KB of a process and every descendant (a command's query worker is its own process)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            m = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
        except OSError:
            m = None
        total += int(m.group(1)) if m else 0
        todo += kids.get(pid, [])
    return total


def timed(cmd: list[str], **kw: Any) -> tuple[float, int]:
    """Wall seconds and peak RSS (KB) of one command: its processes together (sampled ten times a
    second), or its own peak from /usr/bin/time -v where that is higher (a peak between samples)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen(["/usr/bin/time", "-v", *cmd], cwd=ROOT, text=True,
                             **{"stdout": subprocess.DEVNULL, **kw}, stderr=errf)
        peak = 0
        while p.poll() is None:
            peak = max(peak, tree_kb(p.pid))
            time.sleep(0.1)
        wall = time.monotonic() - t0
        errf.seek(0)
        err = errf.read()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return wall, max(peak, int(m.group(1)) if m else 0)


def matrix_yaml(url: str) -> str:
    return "\n".join([
        "name: scale", "baseline: base", "generation:", "  warmup: 1", "  structured_output: false",
        "  max_tokens: 64", "divergence:", "  enabled: false",  # per-case scoring: constant, not what grows
        "variants:", f"  - name: base\n    endpoint: {url}", f"  - name: cand\n    endpoint: {url}",
    ]) + "\n"


def synth_size(n: int, work: Path, browse: bool) -> dict[str, Any]:
    """A synthesized ledger of n rows (benchmarks/synth_ledger.py), then the report timed on it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from synth_ledger import synthesize

    ledger = work / f"synth{n}.db"
    ledger.unlink(missing_ok=True)
    info = synthesize(ledger, n, ["base", "w8a8", "fp8"], [1, 4, 16])
    out: dict[str, Any] = {"requests": info["rows"], "run_s": info["seconds"], "run_rss_mb": 0.0,
                           "rows_per_s": info["rows"] / info["seconds"], "ledger_mb": info["mb"]}
    return out | reports(ledger, work, n) | (_browse(ledger) if browse else {})


def reports(ledger: Path, work: Path, n: int) -> dict[str, Any]:
    """`report`, `report --json` (its size too) and `report --html`: wall seconds and peak RSS each."""
    out: dict[str, Any] = {}
    for key, extra in (("report_s", []), ("json_s", ["--json"]), ("html_s", ["--html", str(work / f"r{n}.html")])):
        out[key], out[key.replace("_s", "_rss_mb")] = _report(ledger, extra, work / f"r{n}.{key}.out")
    out["json_mb"] = (work / f"r{n}.json_s.out").stat().st_size / 2**20
    out["html_mb"] = (work / f"r{n}.html").stat().st_size / 2**20
    return out


def one_size(n: int, work: Path, concurrency: int) -> dict[str, Any]:
    port = free_port()
    stub = subprocess.Popen([*pin(1), sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(port),
                             "--ttft-ms", "20", "--itl-ms", "2", "--fixed-chunks", "16"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30, stub)
        m = work / f"matrix-{n}.yaml"
        m.write_text(matrix_yaml(f"http://127.0.0.1:{port}"), encoding="utf-8")
        ledger = work / f"scale{n}.db"
        # the baseline sends one extra pass (drift's noise floor): 2R+1 passes of 144 cases in all
        repeats = max(1, round((n / N_CASES - 1) / 2))
        env = {**os.environ, "EVALKIT_LEDGER": str(ledger)}
        run_s, rss_kb = timed([*pin(0), *EVALKIT, "run", "--matrix", str(m), "--repeats", str(repeats),
                               "--concurrency", str(concurrency), "--no-grade", "--client-procs", "1", "--quiet"],
                              env=env)  # --quiet: no report at the end, which is timed on its own below
    finally:
        stub.terminate()
        stub.wait()
    rows = int(subprocess.run(["sqlite3", str(ledger), "select count(*) from requests"], capture_output=True,
                              text=True).stdout.strip() or 0) if shutil.which("sqlite3") else None
    if rows is None:
        import sqlite3
        with sqlite3.connect(ledger) as c:
            rows = c.execute("select count(*) from requests").fetchone()[0]
    out: dict[str, Any] = {"requests": rows, "run_s": run_s, "run_rss_mb": rss_kb / 1024,
                           "rows_per_s": rows / run_s, "ledger_mb": ledger.stat().st_size / 2**20}
    out.update(reports(ledger, work, n))
    out.update(_browse(ledger))
    return out


def _report(ledger: Path, extra: list[str], stdout: Path) -> tuple[float, float]:
    with stdout.open("w") as f:
        wall, kb = timed([*pin(0), *EVALKIT, "report", "--ledger", str(ledger), *extra], stdout=f)
    return wall, kb / 1024


def ledger_rows(ledger: Path) -> int:
    con = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        return int(con.execute("select max(id) from requests").fetchone()[0] or 0)
    finally:
        con.close()


def _browse(ledger: Path) -> dict[str, Any]:
    port = free_port()
    p = subprocess.Popen([*pin(0), *EVALKIT, "browse", "--ledger", str(ledger), "--port", str(port)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/{ledger.stem}"
    try:
        first = wait_http(f"{base}", 900, p)
        out: dict[str, Any] = {"browse_first_s": first}
        out["requests_page_s"], _ = get_s(f"{base}/requests")
        out["requests_nofacet_s"], _ = get_s(f"{base}/requests?_nofacet=1")
        out["front_s"], _ = get_s(f"http://127.0.0.1:{port}/")
        out["compare_s"], status = get_s(f"http://127.0.0.1:{port}/-/compare")  # the run's comparison list
        bad_compare = [] if status == 200 else [f"/-/compare:{status}"]
        worst, bad = 0.0, []
        meta = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/-/metadata.json", timeout=60).read())
        for name in meta["databases"][ledger.stem]["queries"]:
            s, status = get_s(f"{base}/{name}")
            worst = max(worst, s)
            if status != 200:
                bad.append(f"{name}:{status}")
        out["canned_worst_s"], out["canned_errors"] = worst, bad_compare + bad
        return out
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


COLS = [("requests", "requests", "{:,}"), ("run_s", "run wall s", "{:.1f}"), ("run_rss_mb", "run peak RSS MB", "{:.0f}"),
        ("rows_per_s", "rows/s", "{:.0f}"), ("ledger_mb", "ledger MB", "{:.0f}"), ("report_s", "report s", "{:.1f}"),
        ("json_s", "--json s", "{:.1f}"), ("html_s", "--html s", "{:.1f}"), ("report_rss_mb", "report peak RSS MB", "{:.0f}"),
        ("json_rss_mb", "--json peak RSS MB", "{:.0f}"), ("html_rss_mb", "--html peak RSS MB", "{:.0f}"),
        ("json_mb", "JSON MB", "{:.2f}"), ("html_mb", "HTML MB", "{:.1f}"),
        ("browse_first_s", "browse 1st page s", "{:.1f}"), ("requests_page_s", "requests+facets s", "{:.2f}"),
        ("canned_worst_s", "slowest canned s", "{:.2f}"), ("front_s", "front page s", "{:.2f}"),
        ("compare_s", "/-/compare s", "{:.2f}")]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(c[1] for c in COLS) + " |", "|" + "---|" * len(COLS)]
    for r in results:
        lines.append("| " + " | ".join(fmt.format(r[k]) if k in r else "-" for k, _, fmt in COLS) + " |")
    for a, b in zip(results, results[1:], strict=False):
        x = b["requests"] / a["requests"]
        cells = [f"growth x{x:.0f}"] + [f"x{b[k] / a[k]:.1f}" if a.get(k) and k in b else "-" for k, _, _ in COLS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated request counts")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--keep", type=Path, default=None, help="write ledgers and HTML here and keep them")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    ap.add_argument("--synth", action="store_true", help="synthesize each ledger (benchmarks/synth_ledger.py), no run")
    ap.add_argument("--no-browse", action="store_true", help="leave Datasette out")
    ap.add_argument("--ledger", type=Path, default=None, help="time only `browse` on this ledger (no run, no report)")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="evalkit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"processor: {host_line(this_host())}", flush=True)
    results = []
    if a.ledger:
        results.append({"requests": ledger_rows(a.ledger), **_browse(a.ledger)})
        print(json.dumps(results[0]), flush=True)
        print(table(results))
        return
    try:
        for n in (int(x) for x in a.sizes.split(",")):
            r = synth_size(n, work, not a.no_browse) if a.synth else one_size(n, work, a.concurrency)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if any(r.get("canned_errors") for r in results):
        print("canned queries that failed:", {r["requests"]: r["canned_errors"] for r in results})
    if a.json:
        a.json.write_text(json.dumps({"host": host_line(this_host()), "results": results}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
