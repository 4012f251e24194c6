"""Load planning: what is sent, in which order, under which pattern. No I/O here.

- sequential: one request at a time (the interactive setting of the study);
- concurrency N: closed loop, N requests in flight, the next one sent when one finishes;
- rate R: open loop, arrivals scheduled from a seeded Poisson (or constant) process at R/s,
  whatever the server does; in flight is uncapped unless `max_concurrency` is set, and any time
  a cap held a request back is measured (`client_wait_ms`);
- sweep: closed-loop concurrency levels, stopping at the first saturated level.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import UsageError
from ..spec.dataset import Case, Message
from ..spec.matrix import Matrix
from ..stats import percentile

Mode = Literal["sequential", "concurrency", "rate"]
Arrival = Literal["poisson", "constant"]


SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass
class Slo:
    """Per-request latency limits: absolute (ms) or relative to the same case's latency on the same
    variant at concurrency 1 (a factor, `ttft=3x`), so a capacity question gets the same kind of
    answer on a fast and a slow machine."""

    absolute_ms: dict[str, float] = field(default_factory=dict)
    relative: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.absolute_ms or self.relative)


def parse_slo(text: str | None, flag: str = "--slo") -> Slo:
    """`ttft=2000,tpot=100,e2e=10000` (ms; `_ms` may be added) or `ttft=3x,e2e=3x` (relative)."""
    out = Slo()
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, val = part.strip().partition("=")
        key, val = key.strip().removesuffix("_ms"), val.strip()
        if not eq or key not in SLO_METRICS:
            hint = " (percentile goals such as ttft_p99=2000 go to --target)" if "_p" in key else ""
            raise UsageError(f"{flag}: '{part}': expected ttft=MS, tpot=MS, e2e=MS or a factor like ttft=3x{hint}")
        rel = val.lower().endswith("x")
        try:
            x = float(val[:-1] if rel else val)
        except ValueError:
            raise UsageError(f"{flag}: '{val}' is not a number of milliseconds or a factor like 3x") from None
        if x <= 0 or (rel and x < 1):
            raise UsageError(f"{flag}: '{part}': must be positive" + (" and at least 1x" if rel else ""))
        (out.relative if rel else out.absolute_ms)[key] = x
    return out


def parse_levels(text: str | None, flag: str = "--sweep") -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8]."""
    if not text:
        return []
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: '{text}': expected comma-separated integers, e.g. 1,2,4,8") from None
    if not levels or any(c < 1 for c in levels):
        raise UsageError(f"{flag}: levels must be positive integers")
    return levels


@dataclass
class LoadSpec:
    """How requests are sent. ``sequential`` is the interactive setting of the study."""

    mode: Mode = "sequential"
    concurrency: int = 1
    rate: float | None = None  # requests/s (open loop)
    arrival: Arrival = "poisson"  # rate mode: exponential gaps (seeded) or a constant 1/rate
    max_concurrency: int | None = None  # rate mode: cap on requests in flight (None = uncapped)
    sweep: list[int] = field(default_factory=list)  # concurrency levels, stop at saturation
    stop_kv: float = 0.9  # saturation: peak KV-cache use at or above this fraction
    stop_on_preemption: bool = True
    stop_on_waiting: bool = True  # a request the server could not admit (no room in the KV cache)
    slo_ttft_ms: float | None = None  # saturation / goodput SLOs
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    # relative SLOs: metric -> factor over the same case's latency at concurrency 1 (same variant)
    slo_relative: dict[str, float] = field(default_factory=dict)
    interleave: bool = False  # bring all variants up at once and alternate A B A B ...
    max_error_rate: float = 0.5  # run policy: a variant with more failed requests than this share is `failed`
    stop_on_failure: bool = False  # run policy: a failed variant stops the run (else the next variant runs)
    trace_offsets: list[float] | None = None  # trace replay: each request's recorded offset (s, sped up), in order
    client_procs: int = 1  # processes sending the load (each its own event loop); the ledger has one writer
    sequential_pass: bool = False  # concurrency N also sends every case at concurrency 1 first (quality under load)
    arrival_seed: int = 0  # the Poisson schedule
    order_seed: int = 0  # interleaving order

    @classmethod
    def from_options(cls, *, mode: str | None = None, concurrency: int | None = None, rate: float | None = None,
                     arrival: str | None = None, max_concurrency: int | None = None, sweep: list[int] | None = None,
                     stop_kv: float = 0.9, slo: Slo | None = None, interleave: bool = False,
                     arrival_seed: int = 0, order_seed: int = 0) -> LoadSpec:
        """One LoadSpec from the command line's options, refusing combinations that contradict
        each other (the rules live here, not in the CLI)."""
        if rate is not None and rate <= 0:
            raise UsageError("--rate must be a positive number of requests per second")
        inferred: Mode = "rate" if rate is not None else "concurrency" if (concurrency or 1) > 1 else "sequential"
        if mode and mode != inferred and not (mode == "concurrency" and concurrency is None and rate is None):
            raise UsageError(f"--mode {mode} conflicts with "
                             + (f"--rate {rate:g}" if rate is not None else f"--concurrency {concurrency or 1}"))
        if rate is not None and concurrency is not None:
            raise UsageError("--concurrency is closed-loop; an open-loop --rate takes --max-concurrency N to cap "
                             "requests in flight")
        if rate is None and (arrival is not None or max_concurrency is not None):
            raise UsageError("--arrival and --max-concurrency shape open-loop arrivals: use them with --rate")
        levels = list(sweep or [])
        if levels and (rate is not None or concurrency):
            raise UsageError("--sweep sets the concurrency levels itself: drop --rate/--concurrency")
        if interleave and (levels or rate is not None or (concurrency or 1) > 1):
            raise UsageError("--interleave alternates variants one request at a time: use it with sequential mode")
        slo = slo or Slo()
        if slo.relative and not (levels and levels[0] == 1):
            raise UsageError("--slo with a factor (e.g. ttft=3x) is relative to the same case at concurrency 1: "
                             "give a --sweep that starts at 1, e.g. --sweep 1,2,4,8")
        spec = cls(mode=mode or inferred, concurrency=concurrency or 1, rate=rate,
                   arrival=arrival or "poisson",  # type: ignore[arg-type]
                   max_concurrency=max_concurrency, sweep=levels, stop_kv=stop_kv,
                   slo_ttft_ms=slo.absolute_ms.get("ttft"), slo_tpot_ms=slo.absolute_ms.get("tpot"),
                   slo_e2e_ms=slo.absolute_ms.get("e2e"), slo_relative=dict(slo.relative),
                   interleave=interleave, arrival_seed=arrival_seed, order_seed=order_seed)
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.mode == "rate" and (self.rate is None or self.rate <= 0):
            raise UsageError("--rate must be a positive number of requests per second")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError("--max-concurrency must be at least 1")
        if self.arrival not in ("poisson", "constant"):
            raise UsageError(f"--arrival must be poisson or constant, not {self.arrival!r}")
        if any(c < 1 for c in self.sweep):
            raise UsageError("--sweep levels must be positive integers")
        if self.sweep and self.mode == "rate":
            raise UsageError("--sweep and --rate are mutually exclusive")
        if not 0 < self.stop_kv <= 1:
            raise UsageError("--stop-kv must be a fraction in (0, 1]")

    @property
    def concurrent(self) -> bool:
        return self.mode != "sequential" or bool(self.sweep)

    def phases(self) -> list[tuple[str, int]]:
        """(phase name, closed-loop concurrency) in order: one per sweep level, else one."""
        if self.sweep:
            return [(f"c={c}", c) for c in self.sweep]
        if self.sequential_pass and self.mode == "concurrency" and self.concurrency > 1:
            return [("c=1", 1), (f"c={self.concurrency}", self.concurrency)]
        return [("main", self.concurrency if self.mode == "concurrency" else 1)]

    def for_matrix(self, quality_under_load: bool) -> LoadSpec:
        """Quality under load compares each case at concurrency 1 with the highest level: a sweep
        must start at 1; a fixed concurrency gets a sequential pass first."""
        if not quality_under_load:
            return self
        if self.sweep:
            if self.sweep[0] != 1:
                raise UsageError("quality_under_load compares each case with its output at concurrency 1: start the "
                                 "sweep at 1 (e.g. --sweep 1,2,4,8)")
            return self
        if self.mode != "concurrency" or self.concurrency <= 1:
            raise UsageError("quality_under_load compares outputs at concurrency 1 and under load: give --concurrency N "
                             "or --sweep 1,2,4,...")
        self.sequential_pass = True
        return self


def load_from_options(matrix_load: Any, *, mode: str | None, concurrency: int | None, rate: float | None,
                      arrival: str | None, max_concurrency: int | None, sweep: str | None, stop_kv: float | None,
                      slo: str | None, interleave: bool, arrival_seed: int, order_seed: int,
                      client_procs: int | None = None, launched_locally: bool = True) -> LoadSpec:
    """The run's load: the command line's options, falling back to the matrix's `load:` section
    for what the command line leaves out (its shape — sweep, concurrency, rate — only when the
    command line gives no shape of its own)."""
    shape_given = any(x is not None for x in (mode, concurrency, rate, sweep)) or interleave
    m = matrix_load
    if not shape_given and m is not None:
        concurrency, rate = m.concurrency, m.rate
        sweep = ",".join(str(c) for c in m.sweep) if m.sweep else None
    spec = LoadSpec.from_options(
        mode=mode, concurrency=concurrency, rate=rate, arrival=arrival, max_concurrency=max_concurrency,
        sweep=parse_levels(sweep), stop_kv=stop_kv if stop_kv is not None else (m.stop_kv if m and m.stop_kv else 0.9),
        slo=parse_slo(slo if slo is not None else (m.slo if m else None)), interleave=interleave,
        arrival_seed=arrival_seed, order_seed=order_seed)
    if m is not None:
        spec.stop_on_waiting = m.stop_on_waiting
    if client_procs is not None and client_procs < 1:
        raise UsageError("--client-procs must be at least 1")
    from .procs import default_procs

    spec.client_procs = client_procs or default_procs(launched_locally)
    return spec


def arrival_offsets(n: int, rate: float, arrival: Arrival, arrival_seed: int) -> list[float]:
    """Scheduled send times in seconds from the start of the load, for n requests at `rate`/s.
    Poisson: exponential gaps from a seeded generator (the same seed gives the same schedule)."""
    rng = random.Random(arrival_seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if arrival == "poisson" else 1.0 / rate
    return out


@dataclass
class WorkItem:
    variant: str
    case: Case
    repeat: int
    warmup: bool
    phase: str = "main"
    concurrency: int = 1
    replica: int | None = None  # which server of a replicated variant (None: the variant has one)
    attempt0: int = 0  # the attempt number it starts at (a resume that sends a failed request again)

    @property
    def target(self) -> str:
        """The server this item goes to: the variant, or `variant#replica`."""
        return self.variant if self.replica is None else f"{self.variant}#{self.replica}"


WARMUP_PROMPT = ("This is a warm-up request, not part of the benchmark. Write one short, friendly sentence "
                 "inviting a colleague to a coffee chat next week.")
# Filler for the long warm-up: prefill is timed at two prompt lengths so the run's duration can
# be estimated before the measured requests (evalkit.execution.estimate). It shares nothing with the cases.
WARMUP_FILLER = ("Background for the warm-up only: the office kitchen has a new kettle, the plants on the third "
                 "floor are watered on Mondays, and the library corner now has two more armchairs. ") * 28


def warmup_cases(cases: list[Case], n: int, structured: bool) -> list[Case]:
    """Warm-up requests that share no prompt with the measured cases (so no measured request
    finds its prefix already cached): first, with structured output, one per schema in use (so
    each grammar is compiled before measuring); then two timing probes, a short and a long
    prompt, whose prefill and decode times estimate the run's duration (`evalkit.execution.estimate`)."""
    if n <= 0 or not cases:
        return []
    schemas = list(dict.fromkeys(c.schema_name for c in cases)) if structured else [cases[0].schema_name]
    out = []
    for i in range(max(n, len(schemas) if structured else n)):
        base = next(c for c in cases if c.schema_name == schemas[i % len(schemas)])
        out.append(base.model_copy(update={
            "id": f"_warmup-{i}-{base.schema_name}",
            "messages": [Message(role="user", content=f"{WARMUP_PROMPT} ({i})")],
        }))
    for kind, filler in (("short", ""), ("long", WARMUP_FILLER)):
        out.append(cases[0].model_copy(update={
            "id": f"_warmup-probe-{kind}-{cases[0].schema_name}",
            "messages": [Message(role="user", content=f"{filler}{WARMUP_PROMPT} (timing probe, {kind})")],
        }))
    return out


def build_plan(matrix: Matrix, variants: list[str], cases: list[Case], repeats: int, load: LoadSpec,
               phase: str = "main", concurrency: int = 1, warmup: bool = True) -> list[WorkItem]:
    items: list[WorkItem] = []
    gen = matrix.generation
    warm = warmup_cases(cases, gen.warmup, gen.structured_output) if warmup else []
    for v in variants:
        items += [WorkItem(v, c, 0, True, phase, concurrency) for c in warm]

    def n_rep(v: str) -> int:
        # the baseline is sent more often: its extra repeats are drift's noise floor
        return gen.baseline_passes(repeats) if v == matrix.baseline else repeats

    top = max(n_rep(v) for v in variants)
    main = [(rep, c) for rep in range(top) for c in cases]
    if load.interleave and len(variants) > 1:
        rng = random.Random(load.order_seed)
        for rep, c in main:
            order = [v for v in variants if rep < n_rep(v)]
            rng.shuffle(order)  # randomised within each case, so neither variant always goes first
            items += [WorkItem(v, c, rep, False, phase, concurrency) for v in order]
    else:
        for v in variants:
            items += [WorkItem(v, c, rep, False, phase, concurrency) for rep, c in main if rep < n_rep(v)]
    return shard(items, {v: matrix.variant(v).n_replicas for v in variants})


def shard(items: list[WorkItem], replicas: dict[str, int]) -> list[WorkItem]:
    """Spread each replicated variant's cases over its servers: case i of the dataset order goes to
    replica i mod N (all repeats of a case to the same server); every server gets the warm-ups."""
    out: list[WorkItem] = []
    order: dict[str, int] = {}
    for it in items:
        n = replicas.get(it.variant, 1)
        if n <= 1:
            out.append(it)
        elif it.warmup:
            out += [WorkItem(it.variant, it.case, it.repeat, True, it.phase, it.concurrency, r) for r in range(n)]
        else:
            idx = order.setdefault(it.case.id, len(order))
            it.replica = idx % n
            out.append(it)
    return out


def reference_latencies(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """(case, repeat) -> its TTFT/TPOT/E2E at concurrency 1: what a relative SLO (`ttft=3x`)
    compares each later request of the same case with."""
    return {(r["case_id"], r["repeat"]): {k: r[f"{k}_ms"] for k in SLO_METRICS if r[f"{k}_ms"] is not None}
            for r in rows if r["error_class"] is None}


def slowdowns(rows: list[dict[str, Any]], reference: dict[tuple[str, int], dict[str, float]],
              metric: str) -> list[float]:
    """Each request's latency over the same case's at concurrency 1 (1.0: no slower)."""
    out = []
    for r in rows:
        ref = reference.get((r["case_id"], r["repeat"]), {}).get(metric)
        if r["error_class"] is None and r[f"{metric}_ms"] is not None and ref:
            out.append(r[f"{metric}_ms"] / ref)
    return out


def saturation_reason(rows: list[dict[str, Any]], load: LoadSpec, preemptions: float | None = None,
                      reference: dict[tuple[str, int], dict[str, float]] | None = None) -> str | None:
    """Why a sweep level counts as saturated (KV, preemptions, requests waiting, SLOs: every reason
    that holds), or None. ``preemptions``: the server's own counter over the level (requests that
    overlapped share a preemption, so summing theirs would count it more than once). ``reference``:
    concurrency-1 latencies per case, for relative SLOs."""
    why = []
    kv = [r["srv_kv_cache_usage_peak"] for r in rows if r["srv_kv_cache_usage_peak"] is not None]
    if kv and max(kv) >= load.stop_kv:
        why.append(f"KV-cache use peaked at {max(kv):.1%} (>= {load.stop_kv:.0%})")
    seen = sum((r["srv_preemptions"] or 0) > 0 for r in rows)
    preempted = preemptions if preemptions is not None else sum(r["srv_preemptions"] or 0 for r in rows)
    if load.stop_on_preemption and preempted > 0:
        why.append(f"{preempted:.0f} preemptions observed ({seen} requests lived through one)")
    waiting = [r["srv_waiting_peak"] for r in rows if r.get("srv_waiting_peak") is not None]
    if load.stop_on_waiting and waiting and max(waiting) >= 1:
        why.append(f"up to {max(waiting):.0f} request(s) waited for room on the server")
    for key, slo in (("ttft_ms", load.slo_ttft_ms), ("tpot_ms", load.slo_tpot_ms), ("e2e_ms", load.slo_e2e_ms)):
        p99 = percentile([r[key] for r in rows if r[key] is not None], 99)
        if slo is not None and p99 is not None and p99 > slo:
            why.append(f"{key.removesuffix('_ms')} p99 {p99:.0f} ms > SLO {slo:.0f} ms")
    for metric, factor in load.slo_relative.items():
        p99 = percentile(slowdowns(rows, reference or {}, metric), 99)
        if p99 is not None and p99 > factor:
            why.append(f"{metric} p99 {p99:.1f}x its concurrency-1 value > SLO {factor:g}x")
    return "; ".join(why) or None
