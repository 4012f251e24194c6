"""The rate search's acceptance (issue 46), against two servers of known capacity: does
`evalkit run --search rate` find each one's max rate within 15 %, and does the whole run take
under 10 minutes? It runs for about 4.5 minutes of wall clock (a search bounded at 4), so it lives
here, not in the test suite; tests/test_frontier.py checks the same claim on a shorter search, and
tests/test_search.py imports the stub and matrix helpers below. Results: docs/measured.md.

Each stub has k slots and serves a request in S = TTFT + (tokens - 1) x ITL = 130 + 3 x 100 =
430 ms, so it finishes at most k / S requests/s: 9.30/s with 4 slots, 18.6/s with 8. With constant
arrivals below k / S no request waits (TTFT 130 ms); above it the queue grows without end, so any
probe long enough breaks TTFT p99 <= 1 s. The true max rate at ttft_p99=1s is therefore k / S.

    .venv/bin/python benchmarks/search_acceptance.py          # exit 1 if either bar is missed
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import free_port  # noqa: E402
from evalkit.host import host_line, this_host  # noqa: E402

SLOTS, TTFT_MS, ITL_MS, TOKENS = {"four": 4, "eight": 8}, 130.0, 100.0, 4
SERVICE_S = (TTFT_MS + (TOKENS - 1) * ITL_MS) / 1000.0


def stub(slots: int, ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    """The stub in its own process (the client's load does not slow it): `slots` run at once, the
    rest wait; a request takes ttft_ms, then itl_ms a token."""
    import requests as http

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(port), "--ttft-ms",
                             str(ttft_ms), "--itl-ms", str(itl_ms), "--kv-tokens", "10000000", "--max-num-seqs",
                             str(slots)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            http.get(f"{url}/health", timeout=1)
            return proc, url
        except http.RequestException:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the stub did not start") from None
            time.sleep(0.1)


def matrix(path: Path, tokens: int, endpoints: dict[str, str]) -> Path:
    path.write_text("name: search\nbaseline: " + next(iter(endpoints)) + "\ngeneration:\n  warmup: 0\n"
                    f"  baseline_repeats: 1\n  max_tokens: {tokens}\n  temperature: 0\n"
                    "  extra_body: {ignore_eos: true}\n  structured_output: false\ntelemetry:\n  interval_s: 0.1\n"
                    "variants:\n" + "".join(f"  - name: {n}\n    endpoint: {u}\n" for n, u in endpoints.items()))
    return path


def cli(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """`cli.py` with ``args`` in a process of its own: (its result, its wall time in s)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return r, time.monotonic() - t0


def claim(out: str, variant: str) -> float:
    """The rate or concurrency the frontier line of ``variant`` claims."""
    line = next(x for x in out.splitlines() if f"frontier {variant}:" in x)
    m = re.search(r"(?:sustains (?:at least )?|between )([\d.]+)", line)
    if m is None:
        raise ValueError(line)
    return float(m.group(1))


def main() -> int:
    stubs = {name: stub(k, TTFT_MS, ITL_MS) for name, k in SLOTS.items()}
    with tempfile.TemporaryDirectory(prefix="evalkit-search-") as d:
        try:
            r, took = cli("run", "--matrix", str(matrix(Path(d) / "m.yaml", TOKENS, {n: u for n, (_, u) in stubs.items()})),
                          "--search", "rate", "--slo", "ttft_p99=1s", "--search-time", "4m", "--no-grade",
                          "--ledger", str(Path(d) / "l.db"), timeout=900)
        finally:
            for proc, _ in stubs.values():
                proc.terminate()
                proc.wait(10)
    print(host_line(this_host()))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return 1
    ok = took < 600.0
    for name, k in SLOTS.items():
        truth, got = k / SERVICE_S, claim(r.stdout + r.stderr, name)
        within = abs(got - truth) <= 0.15 * truth
        ok = ok and within
        print(f"{name}: claimed {got:.2f}/s, true {truth:.2f}/s ({(got - truth) / truth:+.1%}; within 15 %: {within})")
    print(f"the run took {took:.0f} s (under 10 minutes: {took < 600.0})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
