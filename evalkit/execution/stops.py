"""Stop rules as objects (after GuideLLM's constraints): after each load level the runner asks
every rule about each variant. A *saturation* rule ends a sweep's climb for that variant (it
saturated: not a failure); a *failure* rule fails the variant, under any pattern. A new rule is
one type here; the runner never names one.

- `KvFull(fraction)`: the KV cache's peak use reached the fraction;
- `Preempted()`: the server preempted a request (its own counter over the level);
- `Waited()`: a request waited for room on the server;
- `SloBreached(slo)`: a p99 above an absolute SLO, or above a factor of the same case at concurrency 1;
- `ErrorRate(max_rate)`: more than this share of the variant's requests failed;
- `OverSaturated()`: the server cannot keep up (`saturation_signals`): its waiting queue and queue
  time grew over the level, its KV cache sat at its ceiling while it preempted, or the requests it
  finished fell behind the rate they were offered at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from ..catalogue import named
from ..errors import UsageError
from ..stats import percentile

SLO_METRICS = tuple(named("slo"))  # ("ttft", "tpot", "e2e"): the catalogue's, each limiting its `{name}_ms` column


@dataclass
class Slo:
    """Per-request latency limits: absolute (ms) or relative to the same case's latency on the same
    variant at concurrency 1 (a factor, `ttft=3x`), so a capacity question gets the same kind of
    answer on a fast and a slow machine."""

    absolute_ms: dict[str, float] = field(default_factory=dict)
    relative: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.absolute_ms or self.relative)

    def text(self) -> str:
        """The limits as a search holds them: `ttft p99 ≤ 1000 ms, e2e p99 ≤ 3x unloaded`."""
        parts = [f"{k} p99 ≤ {v:g} ms" for k, v in self.absolute_ms.items()]
        parts += [f"{k} p99 ≤ {f:g}x unloaded" for k, f in self.relative.items()]
        return ", ".join(parts) or "no SLO (over-saturation only)"

    def record(self) -> dict[str, Any]:
        return {**{f"slo_{k}_ms": self.absolute_ms.get(k) for k in SLO_METRICS}, "slo_relative": dict(self.relative)}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> Slo:
        return cls({k: d[f"slo_{k}_ms"] for k in SLO_METRICS if d.get(f"slo_{k}_ms") is not None},
                   dict(d.get("slo_relative") or {}))


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
            raise UsageError(f"{flag}: '{part}': expected {', '.join(f'{k}=MS' for k in SLO_METRICS)} or a factor like "
                             f"ttft=3x{hint}")
        rel = val.lower().endswith("x")
        try:
            x = float(val[:-1] if rel else val)
        except ValueError:
            raise UsageError(f"{flag}: '{val}' is not a number of milliseconds or a factor like 3x") from None
        if x <= 0 or (rel and x < 1):
            raise UsageError(f"{flag}: '{part}': must be positive" + (" and at least 1x" if rel else ""))
        (out.relative if rel else out.absolute_ms)[key] = x
    return out


def reference_latencies(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """(case, repeat) -> its TTFT/TPOT/E2E at concurrency 1: what a relative SLO (`ttft=3x`)
    compares each later request of the same case with."""
    return {(r["case_id"], r["repeat"]): {k: r[f"{k}_ms"] for k in SLO_METRICS if r[f"{k}_ms"] is not None}
            for r in rows if r["error_class"] is None}


def reference_of(reference: dict[tuple[str, int], dict[str, float]], case: str, repeat: int) -> dict[str, float]:
    """The same case's latencies at concurrency 1: its own repeat's, else its first (a search's probe
    cycles the cases, so a case's later passes compare with its one unloaded pass)."""
    return reference.get((case, repeat)) or reference.get((case, 0)) or {}


def slowdowns(rows: list[dict[str, Any]], reference: dict[tuple[str, int], dict[str, float]],
              metric: str) -> list[float]:
    """Each request's latency over the same case's at concurrency 1 (1.0: no slower)."""
    out = []
    for r in rows:
        ref = reference_of(reference, r["case_id"], r["repeat"]).get(metric)
        if r["error_class"] is None and r[f"{metric}_ms"] is not None and ref:
            out.append(r[f"{metric}_ms"] / ref)
    return out


class Point(NamedTuple):
    """One request as over-saturation sees it (ms on the run's clock; None: not known)."""

    sent: float
    end: float
    scheduled: float | None
    queue: float | None
    waiting: float | None


SERIES_CAP = 4096  # points a level keeps: past it every other one goes (a million requests stay 4,096)


def thinned(n: int, unkept: Iterable[int], cap: int | None = None) -> list[int]:
    """Which of a level's ``n`` requests (1-based, in the order `LevelOutcome.add` is fed them) its
    `series` ends with, given those it never keeps (``unkept``: failed, or never sent): the same
    thinning, computed on their numbers a stride at a time rather than a request at a time, and a
    stretch of numbers at a time (a byte per request held, not the level's numbers: 2.5 M at 10 M rows)."""
    import numpy as np  # here: the runner's import of this module stays light

    cap = SERIES_CAP if cap is None else cap
    keeps = np.ones(n + 1, dtype=bool)
    keeps[0] = False
    out = np.fromiter(unkept, dtype=np.int64)
    keeps[out[(out >= 1) & (out <= n)]] = False
    kept, stride, lo = np.empty(0, dtype=np.int64), 1, 1
    while lo <= n:
        got = _next_kept(keeps, -(-lo // stride) * stride, stride, cap - len(kept))
        kept = np.concatenate([kept, got])
        if len(kept) < cap:
            break
        kept, stride, lo = kept[::2], stride * 2, int(got[-1]) + 1  # full: every other one goes
    return [int(i) for i in kept]


def _next_kept(keeps: Any, first: int, stride: int, need: int, stretch: int = 1 << 16) -> Any:
    """The first ``need`` kept numbers of ``first``, ``first + stride``, ... (``keeps``: by number)."""
    import numpy as np

    parts, have = [], 0
    for start in range(first, len(keeps), stride * stretch):
        nums = np.arange(start, min(len(keeps), start + stride * stretch), stride, dtype=np.int64)
        nums = nums[keeps[nums]][:need - have]
        parts.append(nums)
        have += len(nums)
        if have >= need:
            break
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


@dataclass
class LevelOutcome:
    """What a stop rule sees of one variant after one level, fed one row at a time (nothing per
    request is kept but, when an SLO asks for them, its three latencies): how many were sent and failed, the peaks the server
    reported, the latencies, each case's latencies (a concurrency-1 level is the reference of a
    relative SLO), and, set by the runner, the server's preemption counter over the level and the
    variant's failed and sent requests over the whole run."""

    n: int = 0
    errors: int = 0
    kv_peak: float | None = None
    waiting_peak: float | None = None
    preempted_rows: int = 0
    preemptions_summed: float = 0.0
    prompt_tokens: int = 0
    prompts: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SLO_METRICS})
    by_case: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    spans: dict[Any, tuple[float, float]] = field(default_factory=dict)  # replica -> first send, last end
    preemptions: float | None = None
    reference: dict[tuple[str, int], dict[str, float]] | None = None
    failed: int = 0
    sent: int = 0
    keep_latencies: bool = True  # each request's latencies: only an absolute SLO needs them
    keep_cases: bool = True  # each case's latencies: only a relative SLO needs them
    series: list[Point] = field(default_factory=list)  # over-saturation's time series, thinned evenly
    stride: int = 1  # keep every stride-th request in `series`
    in_flight_peak: int | None = None  # most requests in flight at once, read back from the ledger (a search's)
    in_flight_mean: float | None = None  # requests in flight on average over the level (Little: sum of E2E / wall)

    def add(self, r: dict[str, Any]) -> None:
        self.n += 1
        if r.get("mono_start_ms") is not None:
            a, b = r["mono_start_ms"], r["mono_start_ms"] + (r["e2e_ms"] or 0.0)
            if r["error_class"] is None and self.n % self.stride == 0:
                waiting = r.get("srv_waiting_start")
                self.series.append(Point(a, b, r.get("scheduled_ms"), r.get("srv_queue_ms"),
                                         waiting if waiting is not None else r.get("srv_waiting_peak")))
                if len(self.series) >= SERIES_CAP:
                    self.series, self.stride = self.series[::2], self.stride * 2
            lo, hi = self.spans.get(r.get("replica"), (a, b))
            self.spans[r.get("replica")] = (min(lo, a), max(hi, b))
        if r.get("srv_kv_cache_usage_peak") is not None:
            self.kv_peak = max(self.kv_peak or 0.0, r["srv_kv_cache_usage_peak"])
        if r.get("srv_waiting_peak") is not None:
            self.waiting_peak = max(self.waiting_peak or 0.0, r["srv_waiting_peak"])
        if r.get("srv_preemptions"):
            self.preempted_rows += r["srv_preemptions"] > 0
            self.preemptions_summed += r["srv_preemptions"]
        if r["error_class"] is not None:
            self.errors += 1
            return
        if r.get("prompt_tokens"):
            self.prompt_tokens += r["prompt_tokens"]
            self.prompts += 1
        if not (self.keep_latencies or self.keep_cases):
            return
        lat = {k: r[f"{k}_ms"] for k in SLO_METRICS if r.get(f"{k}_ms") is not None}
        if self.keep_latencies:
            for k, v in lat.items():
                self.latencies[k].append(v)
        if self.keep_cases:
            self.by_case[(r["case_id"], r["repeat"])] = lat

    def slowdowns(self, metric: str) -> list[float]:
        """Each case's latency over its own at concurrency 1 (1.0: no slower)."""
        ref = self.reference or {}
        out = []
        for (case, rep), lat in self.by_case.items():
            base = reference_of(ref, case, rep).get(metric)
            if metric in lat and base:
                out.append(lat[metric] / base)
        return out

    @property
    def wall_s(self) -> float | None:
        """The level's length: the longest span of one server's requests."""
        return max(hi - lo for lo, hi in self.spans.values()) / 1000.0 if self.spans else None


class StopRule:
    scope: ClassVar[Literal["saturation", "failure"]] = "saturation"

    def check(self, o: LevelOutcome) -> str | None:
        """Why the variant stops here, or None."""
        raise NotImplementedError

    def record(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class KvFull(StopRule):
    fraction: float = 0.9

    def check(self, o: LevelOutcome) -> str | None:
        if o.kv_peak is not None and o.kv_peak >= self.fraction:
            return f"KV-cache use peaked at {o.kv_peak:.1%} (>= {self.fraction:.0%})"
        return None

    def record(self) -> dict[str, Any]:
        return {"stop_kv": self.fraction}


@dataclass(frozen=True)
class Preempted(StopRule):
    def check(self, o: LevelOutcome) -> str | None:
        # the server's own counter: requests that overlapped share a preemption, so summing theirs overcounts
        n = o.preemptions if o.preemptions is not None else o.preemptions_summed
        return f"{n:.0f} preemptions observed ({o.preempted_rows} requests lived through one)" if n > 0 else None

    def record(self) -> dict[str, Any]:
        return {"stop_on_preemption": True}


@dataclass(frozen=True)
class Waited(StopRule):
    def check(self, o: LevelOutcome) -> str | None:
        if o.waiting_peak is not None and o.waiting_peak >= 1:
            return f"up to {o.waiting_peak:.0f} request(s) waited for room on the server"
        return None

    def record(self) -> dict[str, Any]:
        return {"stop_on_waiting": True}


@dataclass(frozen=True)
class SloBreached(StopRule):
    slo: Slo

    def check(self, o: LevelOutcome) -> str | None:
        why = []
        for k, limit in self.slo.absolute_ms.items():
            p99 = percentile(o.latencies[k], 99)
            if p99 is not None and p99 > limit:
                why.append(f"{k} p99 {p99:.0f} ms > SLO {limit:.0f} ms")
        for metric, factor in self.slo.relative.items():
            p99 = percentile(o.slowdowns(metric), 99)
            if p99 is not None and p99 > factor:
                why.append(f"{metric} p99 {p99:.1f}x its concurrency-1 value > SLO {factor:g}x")
        return "; ".join(why) or None


@dataclass(frozen=True)
class ErrorRate(StopRule):
    max_rate: float = 0.5
    scope: ClassVar[Literal["saturation", "failure"]] = "failure"

    def check(self, o: LevelOutcome) -> str | None:
        if o.sent and o.failed / o.sent > self.max_rate:
            return f"{o.failed} of {o.sent} requests failed ({o.failed / o.sent:.0%} > --max-error-rate {self.max_rate:.0%})"
        return None

    def record(self) -> dict[str, Any]:
        return {"max_error_rate": self.max_rate}


def _median(xs: list[float]) -> float | None:
    return percentile(xs, 50) if xs else None


def _slope_rate(times: list[float]) -> float | None:
    """Events per second over the middle 80 % of sorted times (the edges are the ramp in and out)."""
    n = len(times)
    i, j = n // 10, n - 1 - n // 10
    if j - i < 3 or times[j] <= times[i]:
        return None
    return (j - i) / (times[j] - times[i]) * 1000.0


def rates(o: LevelOutcome) -> tuple[float | None, float | None]:
    """(offered, achieved) requests/s of an open-loop level: the schedule's rate, and the rate the
    requests finished at; (None, None) for a closed loop, which offers nothing of its own."""
    sched = sorted(p.scheduled for p in o.series if p.scheduled is not None)
    if len(sched) < len(o.series) // 2 or len(sched) < 5:
        return None, None
    return _slope_rate(sched), _slope_rate(sorted(p.end for p in o.series))


def throughput(o: LevelOutcome) -> float | None:
    """Requests/s the server finished over the middle of a level (a closed loop's too)."""
    return _slope_rate(sorted(p.end for p in o.series))


def in_flight(spans: Iterable[tuple[Any, float, float]]) -> tuple[int, float | None]:
    """(peak, mean) requests in flight from each request's (server, sent, ended) in ms: the peak
    counted per server and summed (each server's clock is its sender's), the mean by Little's law
    (the requests' summed time over the longest server's span)."""
    events: dict[Any, list[tuple[float, int]]] = {}
    busy = 0.0
    for rep, a, b in spans:
        events.setdefault(rep, []).extend(((a, 1), (b, -1)))
        busy += b - a
    peak, wall = 0, 0.0
    for evs in events.values():
        evs.sort()  # at a tie the end (-1) comes first: a closed loop's next request is not an overlap
        now = top = 0
        for _, d in evs:
            now += d
            top = max(top, now)
        peak += top
        wall = max(wall, evs[-1][0] - evs[0][0])
    return peak, (busy / wall if wall > 0 else None)


MIN_POINTS = 9  # fewer requests in a level cannot show a trend: over-saturation says nothing


def saturation_signals(o: LevelOutcome, kv_ceiling: float = 0.9, behind: float = 0.9) -> dict[str, str]:
    """Which over-saturation signals fired over one level (signal -> what was seen): `queue` (the
    server's waiting count or queue time grew from the first third of the level to the last),
    `kv` (KV cache at its ceiling and preemptions), `rate` (finished requests fell behind the
    offered rate by more than 1 - ``behind``). A level's requests in send order; per-request
    server fields, so the queue is seen where it starts, before the client's latency runs away."""
    out: dict[str, str] = {}
    pts = sorted(o.series, key=lambda p: p.sent)
    if len(pts) >= MIN_POINTS:
        third = len(pts) // 3
        head, tail = pts[:third], pts[-third:]
        e2e = _median([p.end - p.sent for p in head]) or 0.0
        grew = []
        w0, w1 = (_median([p.waiting for p in part if p.waiting is not None]) for part in (head, tail))
        if w0 is not None and w1 is not None and w1 >= w0 + 2 and w1 >= 1.5 * w0:
            grew.append(f"waiting {w0:.0f} -> {w1:.0f}")
        q0, q1 = (_median([p.queue for p in part if p.queue is not None]) for part in (head, tail))
        if q0 is not None and q1 is not None and q1 >= q0 + max(25.0, 0.25 * e2e) and q1 >= 1.5 * q0:
            grew.append(f"queue time {q0:,.0f} -> {q1:,.0f} ms")
        if grew:
            out["queue"] = "server queue grew over the level (first third -> last third: " + ", ".join(grew) + ")"
        offered, achieved = rates(o)
        if offered and achieved and achieved < behind * offered:
            out["rate"] = f"finished {achieved:.3g}/s of {offered:.3g}/s offered ({achieved / offered:.0%})"
    n = o.preemptions if o.preemptions is not None else o.preemptions_summed
    if o.kv_peak is not None and o.kv_peak >= kv_ceiling and n > 0:
        out["kv"] = f"KV cache at its ceiling ({o.kv_peak:.0%}) with {n:.0f} preemption(s)"
    return out


@dataclass(frozen=True)
class OverSaturated(StopRule):
    """The server cannot keep up with the level (`saturation_signals`): usable in any sweep."""

    kv_ceiling: float = 0.9
    behind: float = 0.9

    def check(self, o: LevelOutcome) -> str | None:
        sig = saturation_signals(o, self.kv_ceiling, self.behind)
        return "over-saturated: " + "; ".join(f"[{k}] {v}" for k, v in sig.items()) if sig else None

    def record(self) -> dict[str, Any]:
        return {"stop_oversaturated": True}


def steady(o: LevelOutcome) -> str:
    """What a level's steadiness rests on, said: its length, achieved vs offered, the queue's trend."""
    spans = [hi - lo for lo, hi in o.spans.values()]
    secs = max(spans) / 1000.0 if spans else math.nan
    offered, achieved = rates(o)
    pts = sorted(o.series, key=lambda p: p.sent)
    third = len(pts) // 3
    w = [_median([p.waiting for p in part if p.waiting is not None]) for part in (pts[:third], pts[-third:])] \
        if third else [None, None]
    parts = [f"{o.n} requests over {secs:.1f} s"]
    if offered and achieved:
        parts.append(f"achieved {achieved:.3g}/s of {offered:.3g}/s offered")
    if w[0] is not None and w[1] is not None:
        parts.append(f"waiting {w[0]:.0f} -> {w[1]:.0f}")
    if len(pts) < MIN_POINTS:
        parts.append(f"too short to see a trend (< {MIN_POINTS} requests)")
    return ", ".join(parts)


def reasons(rules: tuple[StopRule, ...], scope: str, o: LevelOutcome) -> str | None:
    """Every reason the rules of one scope give (a saturated level may have several), or None."""
    return "; ".join(w for r in rules if r.scope == scope and (w := r.check(o))) or None
