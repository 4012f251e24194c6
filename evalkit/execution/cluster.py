"""Run a matrix on a Ray cluster (`evalkit run --ray [ADDRESS]`): each variant, or each replica of
one, is a Ray task that asks for the variant's resources. On its node the task prepares or
resolves the model, launches vLLM there (or calls the endpoint), sends the cases from a client on
the same node (so the network between driver and cluster never enters TTFT), scrapes that
server's /metrics, and streams every finished row back as it happens. The driver alone writes
the SQLite ledger, so the ledger is one file with the same rows as a local run.

A worker writes into an in-memory ledger of its own (the same runner code); every write it makes
is forwarded to the driver as an event, generically (`ledger.mirror`), and replayed there in order.
A worker or node that dies loses nothing already streamed; its missing requests are what
`--resume` sends, and the failure is recorded on the variant with its cause.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.memory import MemoryPlan
from ..host import this_host
from ..ledger import HeldKeys, Ledger, utcnow
from ..ledger.mirror import MirroredLedger, Replay
from ..measure.client import RequestResult
from ..paths import cache_dir
from ..redact import redact
from ..spec.dataset import Case
from ..spec.matrix import Matrix
from .inputs import RunInputs
from .load import Load
from .ray_driver import Job, drive, ray_init, reap_group, reap_worker
from .runner import CARRIER_FAILED, Progress, RunContext, RunSummary, case_rows, run_group
from .signals import STOP

# Fault injection for tests of worker death: a worker exits abruptly after this many requests.
FAULT_ENV = "EVALKIT_RAY_FAULT_AFTER"
# evalkit's settings a worker needs as the driver has them (never secrets: keys stay named, not sent)
PASS_ENV = (FAULT_ENV, "EVALKIT_CACHE", "EVALKIT_QUANT_PYTHON", "EVALKIT_RUBRICS", "EVALKIT_DATASET", "HF_HUB_OFFLINE")


class EventLedger(MirroredLedger):
    """The worker's ledger: every write is queued as an event for the driver. Fault injection for
    tests: the worker dies abruptly after $EVALKIT_RAY_FAULT_AFTER requests."""

    def __init__(self, events: queue.Queue[tuple[Any, ...]], path: str = ":memory:") -> None:
        super().__init__(events.put, path)
        self.n_requests = 0
        self.die_after = int(os.environ.get(FAULT_ENV, "0") or 0)

    def insert_requests(self, rows: list[dict[str, Any]]) -> None:
        super().insert_requests(rows)
        self.n_requests += len(rows)
        if self.die_after and self.n_requests >= self.die_after:
            time.sleep(0.5)  # let the streamed events leave, then die like a killed node would
            os._exit(70)


class QueueProgress:
    def __init__(self, events: queue.Queue[tuple[Any, ...]]) -> None:
        self.events = events

    def say(self, text: str) -> None:
        self.events.put(("say", text))

    def level_start(self, name: str, total: int) -> None:
        self.events.put(("level_start", name, total))

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        self.events.put(("request_done", variant, case, result))

    def level_end(self, name: str) -> None:
        self.events.put(("level_end", name))


@dataclass
class Shard:
    """What one Ray task runs: one variant (one replica of it), over the run's cases."""

    run_row: dict[str, Any]
    case_rows: list[dict[str, Any]]
    matrix_json: str
    variant: str
    replica: int | None
    cases: list[dict[str, Any]]
    repeats: int
    load: dict[str, Any]
    skip: list[tuple[str, str, int, str]]
    memory: dict[str, dict[str, Any]] | None = None  # the driver's memory-budget plans (MemoryPlan fields)
    variant_rows: list[dict[str, Any]] | None = None  # on a resume: this variant's row as the driver has it
    trace_offsets: list[float] | None = None  # a trace's arrivals: not in the load's record (a trace can be long)


def run_shard(shard: Shard) -> Iterator[tuple[Any, ...]]:
    """The body of the Ray task (a streaming generator): run the shard in a thread, yield its
    events as they come, then a summary."""
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    host = this_host()
    matrix = Matrix.model_validate_json(shard.matrix_json)
    cases = [Case.model_validate(c) for c in shard.cases]
    summary = RunSummary(shard.run_row["id"])
    result: dict[str, Any] = {}
    scratch = tempfile.mkdtemp(prefix="evalkit-worker-")

    def body() -> None:
        try:
            # SQLite connections belong to the thread that made them: this one. A scratch file,
            # not memory: the worker only reads back its own rows, and a long run's must not fill its RAM
            local = EventLedger(events, str(Path(scratch) / "worker.db"))
            local.seed_run(shard.run_row, shard.case_rows, shard.variant_rows)
            load = Load.from_record(shard.load, shard.trace_offsets)
            ctx = RunContext(local, summary.run_id, matrix, cases, shard.repeats, load,
                             HeldKeys(tuple(k) for k in shard.skip), QueueProgress(events), cache_dir() / "logs",  # type: ignore[misc]
                             summary, {k: MemoryPlan(**v) for k, v in (shard.memory or {}).items()})
            run_group(ctx, [shard.variant], 0, replicas=None if shard.replica is None else [shard.replica])
        except BaseException as e:  # reported to the driver, which records it on the variant
            result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            events.put(("_done",))

    t = threading.Thread(target=body, daemon=True)
    t.start()
    yield ("host", host)
    yield ("worker", os.getpid(), os.uname().nodename)
    done = False
    while not done:
        # batches: one object per ~50 ms rather than one per event keeps the worker's own
        # client (same process, same GIL) from waiting on serialisation
        batch = [events.get()]
        deadline = time.monotonic() + 0.05
        while batch[-1][0] != "_done" and len(batch) < 512:
            try:
                batch.append(events.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        done = batch[-1][0] == "_done"
        if done:
            batch.pop()
        if batch:
            yield ("batch", batch)
    t.join()
    shutil.rmtree(scratch, ignore_errors=True)
    yield ("summary", {"n_requests": summary.n_requests, "n_errors": summary.n_errors,
                       "failed_variants": summary.failed_variants, "saturation": summary.saturation,
                       "stages": summary.stages, "error": result.get("error"), "node": os.uname().nodename})


class Apply:
    """Applies one worker's events to the driver's ledger (driver thread only): its writes through
    `Replay`, its progress to the driver's own."""

    def __init__(self, ledger: Ledger, progress: Progress, run_id: str, label: str) -> None:
        self.ledger, self.progress, self.run_id, self.label = ledger, progress, run_id, label
        self.replay = Replay(ledger)
        self.summary: dict[str, Any] | None = None
        self.worker: tuple[int, str] | None = None  # the Ray worker's pid and node

    def __call__(self, ev: tuple[Any, ...], seq: list[int]) -> None:
        kind = ev[0]
        if kind == "batch":
            with self.ledger.transaction():  # one commit per batch, not per row
                for e in ev[1]:
                    self(e, seq)
        elif kind == "host":
            self.replay.host_id = self.ledger.record_host(ev[1])
        elif kind == "worker":
            self.worker = (ev[1], ev[2])
        elif kind == "write":

            def next_seq() -> int:
                seq[0] += 1
                return seq[0]

            self.replay(ev[1], ev[2], ev[3], ev[4], next_seq)
        elif kind == "say":
            self.progress.say(ev[1])
        elif kind == "level_start":
            self.progress.level_start(ev[1], ev[2])
        elif kind == "request_done":
            self.progress.request_done(ev[1], ev[2], ev[3])
        elif kind == "level_end":
            self.progress.level_end(ev[1])
        elif kind == "summary":
            self.summary = ev[1]


class OnRay:
    """Each variant (or replica) as a Ray task; this process writes the ledger. The Ray driver runs
    in a child process: when the node under it dies Ray ends that process at once, and this one
    records every variant the node took with it as `failed`, with the cause."""

    name = "Ray"
    parallel = True  # every variant a task of its own, at the same time (`--order parallel`)

    def __init__(self, address: str | None) -> None:
        self.address = address

    def refuse(self, inp: RunInputs, load: Load) -> str | None:
        import importlib.util

        if inp.time_budget_s is not None:
            return ("--time-budget sizes the run from the first variant's probes, and Ray starts every variant at "
                    "once: give --limit N with --ray")
        if inp.matrix.divergence.enabled and len(inp.matrix.variants) > 1 and "divergence" in inp.graders:
            return ("teacher-forced scoring (the divergence grader) scores the baseline's answers on each "
                    "candidate's live server, and Ray runs the variants at once: drop --ray, or set "
                    "`divergence: {enabled: false}` in the matrix")
        if importlib.util.find_spec("ray") is None:
            return "--ray needs Ray: pip install 'evalkit[ray]'"
        return None

    def run_variants(self, ctx: RunContext) -> None:
        _drive_on_ray(ctx, self.address)


def _drive_on_ray(ctx: RunContext, address: str | None) -> None:
    ledger, matrix, summary, progress, load = ctx.ledger, ctx.matrix, ctx.summary, ctx.progress, ctx.load
    run_row = ledger.require_run(summary.run_id)
    crow = case_rows(ctx.cases, run_row["dataset_hash"])
    jobs: list[Job] = []
    for v in matrix.ordered_variants():
        for rep in ([None] if v.n_replicas == 1 else range(v.n_replicas)):
            res = v.ray_resources()
            opts: dict[str, Any] = {"num_cpus": res.pop("num_cpus", 1.0), "num_gpus": res.pop("num_gpus", 0.0)}
            if res:
                opts["resources"] = res
            env = {k: v for k, v in os.environ.items() if k in PASS_ENV}
            if env:  # evalkit's own settings (and fault tests) reach the workers through their runtime env
                opts["runtime_env"] = {"env_vars": env}
            shard = Shard(run_row, crow, matrix.model_dump_json(), v.name, rep,
                          [c.model_dump(by_alias=True) for c in ctx.cases], ctx.repeats, load.record(),
                          sorted(ctx.skip.of_variant(v.name)),
                          {k: p.to_dict() for k, p in ctx.memory.items()},
                          [r for r in ledger.variants(summary.run_id) if r["name"] == v.name],
                          list(getattr(load.pattern, "offsets", ())) or None)
            jobs.append(Job(v.name if rep is None else f"{v.name}#{rep}", opts, shard))
            progress.say(f"'{jobs[-1].label}' scheduled on Ray with {opts.get('num_cpus')} CPU, "
                         f"{opts.get('num_gpus')} GPU" + (f", {opts['resources']}" if "resources" in opts else ""))
    appliers = {j.label: Apply(ledger, progress, summary.run_id, j.label) for j in jobs}
    seq = [ledger.max_seq(summary.run_id)]
    ok = False
    proc = None
    try:
        import multiprocessing

        mp = multiprocessing.get_context("spawn")  # a fresh interpreter: no SQLite handle or thread of this one
        conn, child_conn = mp.Pipe()
        proc = mp.Process(target=drive, args=(address, jobs, child_conn, run_shard), name="evalkit-ray-driver")
        proc.start()
        child_conn.close()
        ended: set[str] = set()
        driver_error: str | None = None
        cancelled_at: float | None = None
        while True:
            if STOP.requested and cancelled_at is None:  # a signal: the tasks are cancelled (each stops its server)
                cancelled_at = time.monotonic()
                try:
                    conn.send("cancel")
                except OSError:
                    pass
            try:
                if not conn.poll(0.5):
                    if cancelled_at is not None and (not proc.is_alive()
                                                     or time.monotonic() - cancelled_at > STOP.grace_s + 20):
                        break
                    continue
                label, ev = conn.recv()
            except (EOFError, OSError):
                break  # the driver process ended; anything it did not finish is recorded below
            if ev[0] == "_all_done":
                break
            if ev[0] == "_driver_error":
                driver_error = ev[1]
                continue
            ap = appliers[label]
            if ev[0] == "_end":
                ended.add(label)
                if cancelled_at is None or "n_requests" in (ap.summary or {}):
                    _close(ledger, summary, ap)  # a task cancelled by a signal is `interrupted` (finish_run), not failed
            elif ev[0] == "_failed":
                ap.summary = {"error": ev[1]}
            else:
                ap(ev, seq)
        proc.join(timeout=30)
        lost = [j.label for j in jobs if j.label not in ended]
        if lost and not STOP.requested:
            why = (f"the Ray driver could not run it: {driver_error}" if driver_error else
                   f"the Ray driver process ended (exit code {proc.exitcode}) before its task did: the Ray node "
                   "under it died or lost its raylet")
            for label in lost:
                appliers[label].summary = appliers[label].summary or {"error": why}
                _close(ledger, summary, appliers[label])
        STOP.check()
        ok = True
    finally:
        if proc is not None:
            if proc.is_alive():
                proc.join(timeout=15 if ok else 3)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.pid:
                reap_group(proc.pid)
            # a worker whose node died outlives its raylet for a while, in a group of its own
            for ap in appliers.values():
                if ap.worker and (ap.summary or {}).get("error"):
                    reap_worker(*ap.worker)


def _close(ledger: Ledger, summary: RunSummary, ap: Apply) -> None:
    """Fold a finished (or dead) worker's summary into the run's; record a failure's cause."""
    s = ap.summary or {"error": "the worker ended without a summary"}
    summary.n_requests += s.get("n_requests", 0)
    summary.n_errors += s.get("n_errors", 0)
    summary.failed_variants.update(s.get("failed_variants") or {})
    summary.saturation.update(s.get("saturation") or {})
    for k, v in (s.get("stages") or {}).items():
        summary.stages.setdefault(k, {}).update(v)
    if s.get("error"):
        variant = ap.label.split("#")[0]
        cause = redact(f"{CARRIER_FAILED} '{ap.label}' failed: {s['error']}")
        summary.failed_variants[ap.label] = cause
        vid = f"{summary.run_id}:{variant}"
        if ledger.has_variant(vid):
            ledger.update_variant(vid, {"status": "failed", "error": cause, "stopped_at": utcnow()})
        else:
            ledger.upsert_variant({"id": vid, "run_id": summary.run_id, "name": variant, "status": "failed",
                                   "error": cause})


def ray_embed(address: str | None, batch: int = 256) -> Any:
    """An embedding function for the graders that encodes batches on Ray workers (a GPU where the
    cluster gives one); the same model and weights, so the same vectors as a local run. Ray is
    joined at the first texts to encode: a run whose graders embed nothing never starts it here."""
    from ..grading.embeddings import encode_batch, make_embed

    remote: list[Any] = []

    def encode(texts: list[str]) -> Any:
        import numpy as np

        ray = ray_init(address)
        if not remote:
            remote.append(ray.remote(num_cpus=1, max_retries=1)(encode_batch))
        refs = [remote[0].remote(texts[i:i + batch]) for i in range(0, len(texts), batch)]
        return np.concatenate(ray.get(refs), axis=0)

    return make_embed(encode)


__all__ = ["EventLedger", "Job", "OnRay", "Shard", "ray_embed", "ray_init", "run_shard"]
