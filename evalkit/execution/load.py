"""A run's load: its pattern (`patterns.py`: what is sent and when), its stop rules (`stops.py`:
when a variant saturates or fails), its goodput SLOs and its run policy; the work items a level
sends, in order. Options are parsed once, here, at the edge. No I/O.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UsageError
from ..spec.dataset import Case, Message
from ..spec.matrix import Matrix
from .order import ORDERS, Order, balanced, chunks
from .patterns import ClosedLoop, Level, OpenLoop, Pattern, Sequential, Sweep, TraceReplay, pattern_from_record
from .stops import ErrorRate, KvFull, Preempted, Slo, SloBreached, StopRule, Waited, parse_slo


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
class RunPolicy:
    """How a run behaves around its load: a failed variant stops the run or not, processes that
    send, and the order its variants share time in (`order.py`: alternated by default; the kind
    asked for until the run decides it, with the memory planner, before anything is sent)."""

    stop_on_failure: bool = False
    client_procs: int = 1  # processes sending the load (each its own event loop); the ledger has one writer
    order: Order = field(default_factory=lambda: Order(""))  # kind "": not asked, decided by the run

    @property
    def order_seed(self) -> int:
        return self.order.seed

    def record(self) -> dict[str, Any]:
        return {"stop_on_failure": self.stop_on_failure, "client_procs": self.client_procs, **self.order.record()}


@dataclass
class Load:
    pattern: Pattern = field(default_factory=Sequential)
    stops: tuple[StopRule, ...] = (ErrorRate(),)
    slo: Slo = field(default_factory=Slo)  # goodput limits (and a sweep's SLO rule)
    policy: RunPolicy = field(default_factory=RunPolicy)

    def levels(self) -> list[Level]:
        return self.pattern.levels()

    @property
    def concurrent(self) -> bool:
        return self.pattern.concurrent

    def cases_per_pair(self) -> int:
        """The cases that make one pair of the verdicts, on the level they are read at (the first):
        one, or an alternation chunk's worth (`Order.cases_per_pair`)."""
        try:
            first = self.levels()[0]
        except (NotImplementedError, IndexError):  # a search: its probes are chosen as it goes, sent in turn
            return 1
        return self.policy.order.cases_per_pair(first.concurrency, first.sequential)

    def rule(self, kind: type[StopRule]) -> StopRule | None:
        return next((r for r in self.stops if isinstance(r, kind)), None)

    def record(self) -> dict[str, Any]:
        """The flat record the ledger keeps (`runs.load_json`) and the report reads."""
        out: dict[str, Any] = {**self.pattern.record(), **self.slo.record(), **self.policy.record(),
                               "stop_on_preemption": False, "stop_on_waiting": False}
        for r in self.stops:
            out.update(r.record())
        return out

    @classmethod
    def from_record(cls, d: dict[str, Any], trace_offsets: list[float] | None = None) -> Load:
        """The load a run was started with (a ledger from before patterns too: its flat fields)."""
        pattern = pattern_from_record(d, trace_offsets if trace_offsets is not None else d.get("trace_offsets"))
        slo = Slo.from_record(d)
        policy = RunPolicy(bool(d.get("stop_on_failure")), int(d.get("client_procs") or 1), Order.from_record(d))
        return cls(pattern, default_stops(pattern, d.get("stop_kv") or 0.9, d.get("stop_on_preemption", True),
                                          d.get("stop_on_waiting", True), slo, float(d.get("max_error_rate", 0.5))),
                   slo, policy)

    def for_matrix(self, quality_under_load: bool) -> Load:
        """Quality under load compares each case at concurrency 1 with the highest level: a sweep
        must start at 1; a fixed concurrency gets a sequential pass first."""
        if not quality_under_load:
            return self
        p = self.pattern
        if p.adaptive:  # a search begins with its unloaded reference at concurrency 1
            return self
        if isinstance(p, Sweep):
            if p.concurrencies[0] != 1:
                raise UsageError("quality_under_load compares each case with its output at concurrency 1: start the "
                                 "sweep at 1 (e.g. --sweep 1,2,4,8)")
            return self
        if not isinstance(p, ClosedLoop) or p.concurrency <= 1:
            raise UsageError("quality_under_load compares outputs at concurrency 1 and under load: give --concurrency N "
                             "or --sweep 1,2,4,...")
        self.pattern = ClosedLoop(p.concurrency, sequential_pass=True)
        return self


def default_stops(pattern: Pattern, stop_kv: float, on_preemption: bool, on_waiting: bool, slo: Slo,
                  max_error_rate: float) -> tuple[StopRule, ...]:
    """A sweep's saturation rules (KV, preemption, waiting, SLOs) and every pattern's error rate."""
    rules: list[StopRule] = [ErrorRate(max_error_rate)]
    if pattern.saturates:
        rules.append(KvFull(stop_kv))
        if on_preemption:
            rules.append(Preempted())
        if on_waiting:
            rules.append(Waited())
        if slo:
            rules.append(SloBreached(slo))
    return tuple(rules)


def load_from_options(matrix_load: Any, *, mode: str | None = None, concurrency: int | None = None,
                      rate: float | None = None, arrival: str | None = None, max_concurrency: int | None = None,
                      sweep: str | None = None, stop_kv: float | None = None, slo: str | None = None,
                      order: str | None = None, arrival_seed: int = 0, order_seed: int = 0,
                      client_procs: int | None = None, launched_locally: bool = True,
                      trace_offsets: list[float] | None = None, max_error_rate: float | None = None,
                      stop_on_failure: bool = False) -> Load:
    """The run's load from the command line's options, falling back to the matrix's `load:`
    section for what the command line leaves out (its shape — sweep, concurrency, rate — only when
    the command line gives no shape of its own). Contradicting options are refused here."""
    m = matrix_load
    shape_given = any(x is not None for x in (mode, concurrency, rate, sweep)) or trace_offsets
    if not shape_given and m is not None:
        concurrency, rate = m.concurrency, m.rate
        sweep = ",".join(str(c) for c in m.sweep) if m.sweep else None
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be a positive number of requests per second")
    inferred = "rate" if rate is not None else "concurrency" if (concurrency or 1) > 1 else "sequential"
    if mode and mode != inferred and not (mode == "concurrency" and concurrency is None and rate is None):
        raise UsageError(f"--mode {mode} conflicts with "
                         + (f"--rate {rate:g}" if rate is not None else f"--concurrency {concurrency or 1}"))
    if rate is not None and concurrency is not None:
        raise UsageError("--concurrency is closed-loop; an open-loop --rate takes --max-concurrency N to cap "
                         "requests in flight")
    if rate is None and trace_offsets is None and (arrival is not None or max_concurrency is not None):
        raise UsageError("--arrival and --max-concurrency shape open-loop arrivals: use them with --rate")
    if arrival is not None and arrival not in ("poisson", "constant"):
        raise UsageError(f"--arrival must be poisson or constant, not {arrival!r}")
    levels = parse_levels(sweep)
    if levels and (rate is not None or concurrency):
        raise UsageError("--sweep sets the concurrency levels itself: drop --rate/--concurrency")
    if order is not None and order not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}, not {order!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise UsageError("--max-concurrency must be at least 1")
    if client_procs is not None and client_procs < 1:
        raise UsageError("--client-procs must be at least 1")
    kv = stop_kv if stop_kv is not None else (m.stop_kv if m is not None and m.stop_kv else 0.9)
    if not 0 < kv <= 1:
        raise UsageError("--stop-kv must be a fraction in (0, 1]")
    limits = parse_slo(slo if slo is not None else (m.slo if m is not None else None))
    if limits.relative and not (levels and levels[0] == 1):
        raise UsageError("--slo with a factor (e.g. ttft=3x) is relative to the same case at concurrency 1: "
                         "give a --sweep that starts at 1, e.g. --sweep 1,2,4,8")
    pattern: Pattern
    if trace_offsets is not None:
        pattern = TraceReplay(tuple(trace_offsets), max_concurrency)
    elif levels:
        pattern = Sweep(tuple(levels))
    elif rate is not None:
        pattern = OpenLoop(rate, arrival or "poisson", max_concurrency, arrival_seed)  # type: ignore[arg-type]
    elif (concurrency or 1) > 1 or mode == "concurrency":
        pattern = ClosedLoop(concurrency or 1)
    else:
        pattern = Sequential()
    from .procs import default_procs

    policy = RunPolicy(stop_on_failure, client_procs or default_procs(launched_locally), Order(order or "", seed=order_seed))
    on_waiting = m.stop_on_waiting if m is not None else True
    stops = default_stops(pattern, kv, True, on_waiting, limits, 0.5 if max_error_rate is None else max_error_rate)
    return Load(pattern, stops, limits, policy)


@dataclass(slots=True)
class WorkItem:
    variant: str
    case: Case
    repeat: int
    warmup: bool
    level: str = "main"
    concurrency: int = 1
    replica: int | None = None  # which server of a replicated variant (None: the variant has one)
    attempt0: int = 0  # the attempt number it starts at (a resume that sends a failed request again)
    order_block: int | None = None  # its group of the alternation (`order.py`): a case, or a loaded level's chunk
    order_position: int | None = None  # where in that group it was sent (0: first)

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


def warmup_cases(cases: Sequence[Case], n: int, structured: bool) -> list[Case]:
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
            "id": f"_warmup-{i}-{base.schema_name or 'text'}",
            "messages": [Message(role="user", content=f"{WARMUP_PROMPT} ({i})")],
        }))
    for kind, filler in (("short", ""), ("long", WARMUP_FILLER)):
        out.append(cases[0].model_copy(update={
            "id": f"_warmup-probe-{kind}-{cases[0].schema_name or 'text'}",
            "messages": [Message(role="user", content=f"{filler}{WARMUP_PROMPT} (timing probe, {kind})")],
        }))
    return out


def _measured(matrix: Matrix, variants: list[str], cases: Sequence[Case], repeats: int, load: Load, level: str,
              concurrency: int, sequential: bool = True, stamp: tuple[int, int] | None = None) -> Iterator[WorkItem]:
    """Every case and repeat of the variants, in sending order, each on its replica: generated,
    never listed. Alternated (`order.py`): on a ``sequential`` level each case's requests (every
    variant and repeat, the baseline's noise-floor passes too) side by side in a balanced order; on a
    loaded level chunk by chunk, each chunk sent to every variant in turn. One after the other:
    each variant's repeats in turn (the baseline's noise-floor passes after its repeats).
    ``stamp``: the (block, position) of a block of a one-at-a-time run (`--order blocks`)."""
    gen = matrix.generation
    replicas = {v: matrix.variant(v).n_replicas for v in variants}
    index = {c.id: i for i, c in enumerate(cases)}  # case i goes to replica i mod N (all its repeats too)

    def n_rep(v: str) -> int:
        # the baseline is sent more often: its extra repeats are drift's noise floor
        return gen.baseline_passes(repeats) if v == matrix.baseline else repeats

    def item(v: str, c: Case, rep: int, block: int | None = None, pos: int | None = None) -> WorkItem:
        n = replicas.get(v, 1)
        return WorkItem(v, c, rep, False, level, concurrency, index[c.id] % n if n > 1 else None,
                        order_block=block, order_position=pos)

    order = load.policy.order
    if order.alternates and len(variants) > 1 and sequential:
        slots = [(v, rep) for v in variants for rep in range(n_rep(v))]
        perms = balanced(slots, order.seed)
        for b, c in enumerate(cases):
            for pos, (v, rep) in enumerate(next(perms)):
                yield item(v, c, rep, b, pos)
    elif order.alternates and len(variants) > 1:
        perms = balanced(variants, order.seed)
        for b, part in enumerate(chunks(cases, order.chunk_for(concurrency, len(cases)))):
            for pos, v in enumerate(next(perms)):
                for rep in range(n_rep(v)):
                    for c in part:
                        yield item(v, c, rep, b, pos)
    else:
        block, pos = stamp if stamp is not None else (None, None)
        for v in variants:
            for rep in range(n_rep(v)):
                for c in cases:
                    yield item(v, c, rep, block, pos)


def warmup_items(matrix: Matrix, variants: list[str], cases: Sequence[Case], level: str = "main",
                 concurrency: int = 1) -> list[WorkItem]:
    """Each variant's warm-ups, on every server of a replicated variant."""
    gen = matrix.generation
    warm = warmup_cases(cases, gen.warmup, gen.structured_output)
    items: list[WorkItem] = []
    for v in variants:
        n = matrix.variant(v).n_replicas
        items += [WorkItem(v, c, 0, True, level, concurrency, r) for c in warm
                  for r in ([None] if n <= 1 else range(n))]
    return items


def build_work(matrix: Matrix, variants: list[str], cases: list[Case], repeats: int, load: Load,
               level: str = "main", concurrency: int = 1, warmup: bool = True) -> list[WorkItem]:
    """The work items one level sends, as a list: the warm-ups (first level only), then every case
    and repeat (`Work` makes the same measured items on demand, which a large run needs)."""
    warm = warmup_items(matrix, variants, cases, level, concurrency) if warmup else []
    return warm + list(_measured(matrix, variants, cases, repeats, load, level, concurrency, concurrency == 1))


def sized_cases(cases: Sequence[Case], requests: int, repeats: int) -> tuple[list[Case], int]:
    """A level of ``requests`` requests per variant (a search's probe): the cases in a fixed shuffled
    order (a probe of fewer requests than cases takes a spread of them, not the file's first ones) and
    the repeats that cycle them far enough."""
    order = list(cases)
    random.Random(0).shuffle(order)
    return order, max(repeats, -(-requests // max(1, len(order))))


def item_done(item: WorkItem, skip: Collection[tuple[str, str, int, str]]) -> bool:
    """Whether an item (every turn of a conversation) already has its final rows."""
    if not skip:
        return False
    ids = [item.case.turn_case(k).id for k in range(len(item.case.turns) + 1)] if item.case.turns else [item.case.id]
    return all((item.variant, i, item.repeat, item.level) in skip for i in ids)


@dataclass
class Work:
    """One level's measured items, made on demand each time it is iterated (a million requests are
    never in memory at once): the servers this process opened, less what a resume already has
    (`skip`), each starting at its next attempt number, limited to the cases a time budget kept."""

    matrix: Matrix
    variants: list[str]
    cases: Sequence[Case]
    repeats: int
    load: Load
    level: str = "main"
    concurrency: int = 1
    targets: Collection[str] | None = None
    skip: Collection[tuple[str, str, int, str]] = frozenset()
    attempts: dict[tuple[str, str, int, str], int] = field(default_factory=dict)
    keep: frozenset[str] | None = None
    sequential: bool = True  # a level of one request at a time (alternated case by case, not chunk by chunk)
    stamp: tuple[int, int] | None = None  # (block, position) of a one-at-a-time block (`--order blocks`)
    cap: int | None = None  # at most this many items per variant (a search's probe: its cases cycled)
    deadline: float | None = None  # time.monotonic() past which no item is given (a search's time bound)
    _counts: dict[str, int] | None = field(default=None, repr=False)

    def __iter__(self) -> Iterator[WorkItem]:
        taken: dict[str, int] = {}
        for it in _measured(self.matrix, self.variants, self.cases, self.repeats, self.load, self.level,
                            self.concurrency, self.sequential, self.stamp):
            if self.deadline is not None and time.monotonic() > self.deadline:
                return
            if (self.targets is not None and it.target not in self.targets) or \
                    (self.keep is not None and it.case.id not in self.keep) or item_done(it, self.skip):
                continue
            if self.cap is not None:
                if taken.get(it.variant, 0) >= self.cap:
                    continue
                taken[it.variant] = taken.get(it.variant, 0) + 1
            it.attempt0 = self.attempts.get((it.variant, it.case.id, it.repeat, it.level), 0)
            yield it

    def counts(self) -> dict[str, int]:
        """Items per target, counted in one pass (and kept: the work does not change)."""
        if self._counts is None:
            out: dict[str, int] = {}
            for it in self:
                out[it.target] = out.get(it.target, 0) + 1
            self._counts = out
        return self._counts

    def __len__(self) -> int:
        return sum(self.counts().values())

    def count(self, variant: str) -> int:
        return sum(n for t, n in self.counts().items() if t.split("#")[0] == variant)

    def target_names(self) -> list[str]:
        return list(self.counts())

    def for_target(self, target: str) -> Iterator[WorkItem]:
        return (it for it in self if it.target == target)

    def only(self, case_ids: Collection[str]) -> Work:
        """The same work limited to these cases (what a time budget kept)."""
        return replace(self, keep=frozenset(case_ids), _counts=None)
