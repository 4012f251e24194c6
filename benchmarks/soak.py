"""A chaos soak: evalkit sends against two stub servers (one per variant) for a set time while
faults land at random, then every run is finished and checked.

The faults, dealt in shuffled rounds so a short soak still sees each kind:
  kill_server      SIGKILL one stub server mid-run, start it again on its port 0.5–3 s later
  sigterm_evalkit  SIGTERM to `evalkit run` (a graceful stop: exit 143, the run `interrupted`)
  sigkill_evalkit  SIGKILL to `evalkit run` alone: its client processes must notice and exit
  disk_full        the next `evalkit run` starts with a file-size limit of 64–512 KB (RLIMIT_FSIZE,
                   SIGXFSZ ignored): its writes past that offset fail as on a full disk
With --ray every run goes through Ray (`evalkit run --ray`, a local instance each time) and two
more faults join the deck:
  kill_ray_worker  SIGKILL the Ray worker running a variant's task (`ray::run_shard`)
  kill_raylet      SIGKILL the node's raylet: the whole node dies, the Ray driver process with it
After a fault the run is resumed (`--resume RUN --retry-failed`); a run that completes is
followed by a new one in the same ledger until the time is up, and the last is finished without
faults. Then, per run: one final row for every planned request and no key twice; the run and
each variant `complete`; no process left in any evalkit session; `evalkit report --json` builds.

    .venv/bin/python benchmarks/soak.py --duration 1800        # the issue's 30 minutes
    .venv/bin/python benchmarks/soak.py --duration 600 --ray --fault-every 20
    .venv/bin/python benchmarks/soak.py --duration 60 --json   # what tests/test_soak.py runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import free_port, wait_http  # noqa: E402
from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.spawn import with_file_size_limit  # noqa: E402

EVALKIT = [str(Path(sys.executable).with_name("evalkit"))]
FAULTS = ("kill_server", "sigterm_evalkit", "sigkill_evalkit", "disk_full")
RAY_FAULTS = {"kill_ray_worker": "ray::run_shard", "kill_raylet": "raylet/raylet"}  # fault -> its target's args
N_CASES = 144  # data/resume_gen_benchmark.jsonl


class Stub:
    """One stub server on a fixed port that can be killed and started again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(self.port),
                                      "--ttft-ms", "40", "--itl-ms", "15", "--fixed-chunks", "12"],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"{self.url}/health", 30, self.proc)
        self.restart_at = None

    def kill(self, down_s: float) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.restart_at = time.monotonic() + down_s

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Soak:
    work: Path
    duration_s: float
    seed: int
    fault_every_s: float = 6.0
    repeats: int = 2
    concurrency: int = 8
    rng: random.Random = field(init=False)
    log: list[dict[str, Any]] = field(default_factory=list)
    sessions: set[int] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)
    deck: list[str] = field(default_factory=list)
    t0: float = 0.0
    server_down: bool = False
    ray: bool = False

    @property
    def faults(self) -> tuple[str, ...]:
        return (*FAULTS, *RAY_FAULTS) if self.ray else FAULTS

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.ledger = self.work / "soak.db"
        self.stubs = [Stub(free_port()), Stub(free_port())]
        self.matrix = self.work / "matrix.yaml"

    def say(self, what: str, **kw: Any) -> None:
        entry = {"t_s": round(time.monotonic() - self.t0, 1), "what": what, **kw}
        self.log.append(entry)
        print(f"{entry['t_s']:7.1f} s  {what}  " + "  ".join(f"{k}={v}" for k, v in kw.items()), flush=True)

    def next_fault(self) -> str:
        if not self.deck:
            self.deck = list(self.faults)
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    # -- evalkit ---------------------------------------------------------------------------------
    def launch(self, run_id: str | None, fsize: int | None) -> subprocess.Popen[str]:
        args = ["run", "--resume", run_id, "--retry-failed"] if run_id else \
            ["run", "--matrix", str(self.matrix), "--repeats", str(self.repeats), "--concurrency",
             str(self.concurrency), "--max-error-rate", "1", "--client-procs", "2"]
        cmd = [*EVALKIT, *args, "--ledger", str(self.ledger), "--no-grade", "-q", *(["--ray"] if self.ray else [])]

        if fsize is not None:  # a write past the limit fails (EFBIG), as on a full disk
            cmd = with_file_size_limit(cmd, fsize)
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        self.sessions.add(p.pid)
        return p

    def latest_run(self) -> str | None:
        if not self.ledger.exists():
            return None
        with sqlite3.connect(self.ledger) as c:
            row = c.execute("select id from runs order by created_at desc limit 1").fetchone()
        return row[0] if row else None

    def run_status(self, run_id: str) -> str:
        with sqlite3.connect(self.ledger) as c:
            return str(c.execute("select status from runs where id = ?", (run_id,)).fetchone()[0])

    # -- the soak --------------------------------------------------------------------------------
    def go(self) -> dict[str, Any]:
        self.matrix.write_text("\n".join([
            "name: soak", "baseline: base", "generation:", "  warmup: 0", "  baseline_repeats: 1",
            "  structured_output: false", "  max_tokens: 32", "divergence:", "  enabled: false",
            "variants:", f"  - name: base\n    endpoint: {self.stubs[0].url}",
            f"  - name: cand\n    endpoint: {self.stubs[1].url}"]) + "\n", encoding="utf-8")
        for s in self.stubs:
            s.start()
        self.t0 = time.monotonic()
        end = self.t0 + self.duration_s
        resume: str | None = None
        fsize: int | None = None
        outcomes: list[str] = []
        try:
            while time.monotonic() < end:
                before = self.run_status(resume) if resume else "-"
                latest = self.latest_run()
                p = self.launch(resume, fsize)
                self.say("evalkit run", resume=resume or "-", fsize_limit=fsize or "-")
                limited, fsize = fsize, None
                fault_at = time.monotonic() + self.rng.expovariate(1 / self.fault_every_s)
                rc, out, dealt = self.supervise(p, fault_at, end)
                run_id = resume or (self.latest_run() if self.latest_run() != latest else None)  # None: not created
                if run_id and run_id not in self.runs:
                    self.runs.append(run_id)
                status = self.run_status(run_id) if run_id else "-"
                outcomes.append(self.judge(rc, out, status, dealt, before, limited))
                resume = run_id if status != "complete" else None
                if dealt == "disk_full":
                    # no write may reach past 64–512 KB into any file: the WAL's appends and the
                    # checkpoint's pages soon do, as when the disk has that little room left
                    fsize = self.rng.randint(64, 512) * 1024
            for s in self.stubs:
                if s.restart_at is not None:
                    s.start()
            for run_id in self.runs:  # finish every run, fault-free
                if self.run_status(run_id) != "complete":
                    p = self.launch(run_id, None)
                    out = p.communicate(timeout=900)[0]
                    self.say("finish", run=run_id, rc=p.returncode, tail=out.strip().splitlines()[-1:])
        finally:
            for s in self.stubs:
                s.stop()
            if sys.exc_info()[0] is not None:  # the soak itself was stopped: take its evalkit with it
                for pgid in self.sessions:
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                    except OSError:
                        pass
        return self.check(outcomes)

    def supervise(self, p: subprocess.Popen[str], fault_at: float, end: float) -> tuple[int, str, str | None]:
        """Wait for `evalkit run` to exit, dealing faults as they fall due; returns its exit code,
        its output and the fault dealt to it (None: it ended on its own)."""
        dealt: str | None = None
        self.server_down = any(s.restart_at is not None for s in self.stubs)  # a server down while this one ran
        while True:
            now = time.monotonic()
            for s in self.stubs:
                if s.restart_at is not None and now >= s.restart_at:
                    s.start()
                    self.say("server back", port=s.port)
            if p.poll() is not None:
                return p.returncode, p.stdout.read() if p.stdout else "", dealt
            if now >= end and dealt is None:  # time is up: stop it; it is finished below without faults
                p.send_signal(signal.SIGTERM)
                dealt = "time_up"
                self.say(dealt, pid=p.pid)
            if now >= fault_at and dealt is None:
                fault = self.next_fault()
                if fault == "kill_server":
                    s = self.rng.choice(self.stubs)
                    if s.restart_at is None:
                        down = self.rng.uniform(0.5, 3.0)
                        s.kill(down)
                        self.server_down = True
                        self.say(fault, port=s.port, down_s=round(down, 1))
                elif fault == "sigkill_evalkit":
                    p.kill()
                    dealt = fault
                    self.say(fault, pid=p.pid)
                elif fault in RAY_FAULTS:
                    target = self.in_session(p.pid, RAY_FAULTS[fault])
                    if target is None:  # Ray is still starting (or done): the same fault again soon
                        self.deck.append(fault)
                        fault_at = now + 1.0
                        continue
                    os.kill(target, signal.SIGKILL)
                    dealt = fault
                    self.say(fault, pid=target)
                else:  # sigterm_evalkit; disk_full stops this one and limits the next start's file size
                    p.send_signal(signal.SIGTERM)
                    dealt = fault
                    self.say(fault, pid=p.pid)
                fault_at = now + self.rng.expovariate(1 / self.fault_every_s)
            time.sleep(0.05)

    def judge(self, rc: int, out: str, status: str, dealt: str | None, before: str, fsize: int | None = None) -> str:
        """Whether the exit code and the stored status tell the truth about what happened. A signal
        that lands as the run ends on its own may find it complete, and one that lands while
        evalkit is still starting (nothing written yet) leaves the status as it was: both true."""
        tb = "Traceback" in out
        errors = [x for x in out.splitlines() if x.startswith("Error:")]
        if self.server_down and rc == 2 and len(errors) == 1 and "nothing was sent" in errors[0]:
            # launched while a killed server was still down: the probe refuses before anything is
            # sent (a usage error, exit 2) and the stored status stays as it was
            ok = status == before and not tb
            self.say("exit", rc=rc, status=status, after="server down at start", truthful=ok)
            return "ok" if ok else f"{dealt}: rc {rc}, status {status}"
        if "cannot write the ledger" in out or (fsize is not None and rc == 1 and len(errors) == 1):
            # a full disk: the ledger's writes fail, or (with --ray) Ray's own files do first and it
            # cannot start; either way one line, and the status is what could still be written. A
            # signal dealt while it was on its way out may still end it (its said line stands)
            late = {-9} if dealt == "sigkill_evalkit" else {143, -15} if dealt in ("sigterm_evalkit", "disk_full",
                                                                                  "time_up") else set()
            dealt = "ledger write failed" if "cannot write the ledger" in out else "ray could not start (disk full)"
            ok = rc in {1} | late and status in ("running", "interrupted", "failed", before) and len(errors) == 1
        else:
            # a signal: SIGKILL leaves `running`, SIGTERM `interrupted` (143), or -15 while evalkit
            # had not yet (or no longer) its handler; a server down may fail a variant (exit 1), and
            # so does a dead Ray worker or node (unless its task had just ended)
            if dealt in RAY_FAULTS:
                ok = (rc, status) in {(1, "failed"), (0, "complete")}
                ok = ok and not tb and "Fatal Python error" not in out
                self.say("exit", rc=rc, status=status, after=dealt, truthful=ok,
                         **({} if ok else {"output": out.strip().splitlines()[-12:]}))
                return "ok" if ok else f"{dealt}: rc {rc}, status {status}" + (", traceback" if tb else "")
            sig_rc = {-9} if dealt == "sigkill_evalkit" else {143, -15} if dealt else set()
            ok_rc = {0} | sig_rc | ({1} if self.server_down else set())
            ok_status = {"complete", before} | ({"failed"} if self.server_down else set()) \
                | ({"running"} if dealt == "sigkill_evalkit" else {"interrupted"} if dealt else set())
            ok = rc in ok_rc and status in ok_status and (rc != 0 or status == "complete") \
                and (status != "complete" or rc in {0} | sig_rc)
        ok = ok and not tb and "Fatal Python error" not in out
        self.say("exit", rc=rc, status=status, after=dealt or "-", truthful=ok,
                 **({} if ok else {"output": out.strip().splitlines()[-12:]}))
        return "ok" if ok else f"{dealt}: rc {rc}, status {status}" + (", traceback" if tb else "")

    def check(self, outcomes: list[str]) -> dict[str, Any]:
        time.sleep(1.0)  # client processes of a killed evalkit notice their parent is gone
        with sqlite3.connect(self.ledger) as c:
            runs = []
            for run_id in self.runs:
                finals = c.execute("select count(*), count(distinct variant || '|' || case_id || '|' || repeat), "
                                   "sum(error_class is not null) from requests "
                                   "where run_id = ? and final = 1 and is_warmup = 0", (run_id,)).fetchone()
                sent_again = c.execute("select count(*) from requests where run_id = ? and final = 0 and is_warmup = 0",
                                       (run_id,)).fetchone()[0]
                statuses = [r[0] for r in c.execute("select status from variants where run_id = ?", (run_id,))]
                runs.append({"run": run_id, "finals": finals[0], "distinct": finals[1], "failed": finals[2] or 0,
                             "superseded": sent_again,
                             "planned": N_CASES * self.repeats * 2, "status": self.run_status(run_id),
                             "variants": statuses})
        left = self.leftover()
        reports = [subprocess.run([*EVALKIT, "report", "--ledger", str(self.ledger), "--run", r["run"], "--json"],
                                  cwd=ROOT, capture_output=True, text=True).returncode for r in runs]
        faults = {f: sum(e["what"] == f for e in self.log) for f in self.faults}
        held = {
            "every request once": all(r["finals"] == r["distinct"] == r["planned"] for r in runs),
            "statuses true at each exit": all(o == "ok" for o in outcomes),
            "runs and variants complete": all(r["status"] == "complete" and set(r["variants"]) == {"complete"}
                                              for r in runs),
            "no process left": not left,
            "report builds": all(rc == 0 for rc in reports),
        }
        return {"host": host_line(this_host()), "duration_s": self.duration_s, "seed": self.seed, "ray": self.ray,
                "faults": faults,
                "runs": runs, "exits": outcomes, "left": left, "held": held, "log": self.log}

    @staticmethod
    def in_session(sid: int, needle: str) -> int | None:
        """A process of this evalkit's session whose command line holds ``needle``."""
        ps = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
        for line in ps.splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and int(parts[1]) == sid and needle in parts[2]:
                return int(parts[0])
        return None

    def leftover(self, wait_s: float = 10.0) -> list[str]:
        """Processes still in a session an `evalkit run` led, after up to ``wait_s`` for those on
        their way out (a zombie has ended: its exit status only waits to be collected)."""
        deadline = time.monotonic() + wait_s
        while True:
            ps = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
            out = []
            for line in ps.splitlines():
                parts = line.split(None, 3)
                if len(parts) >= 3 and int(parts[1]) in self.sessions and not parts[2].startswith("Z"):
                    out.append(line.strip())
            if not out or time.monotonic() > deadline:
                return out
            time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800, help="seconds of faults (then every run is finished)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between faults")
    ap.add_argument("--work", type=Path, default=None, help="keep the ledger here")
    ap.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    ap.add_argument("--ray", action="store_true", help="every run through Ray; Ray workers and nodes killed too")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: clean up (servers, evalkit) on the way out
    work = a.work or Path(tempfile.mkdtemp(prefix="evalkit-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    r = Soak(work, a.duration, a.seed, a.fault_every, ray=a.ray).go()
    print(f"\n{r['host']}\nfaults: " + ", ".join(f"{k} {v}" for k, v in r["faults"].items()))
    for run in r["runs"]:
        print(f"run {run['run']}: {run['finals']} final rows, {run['distinct']} distinct, {run['planned']} planned, "
              f"{run['failed']} failed (final), {run['superseded']} failed rows sent again, {run['status']}, "
              f"variants {', '.join(run['variants'])}")
    for k, v in r["held"].items():
        print(f"{'held' if v else 'BROKE'}: {k}")
    for line in r["left"]:
        print(f"left: {line}")
    if a.json:
        print(json.dumps(r))
    return 0 if all(r["held"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
