"""Each load level's figures as ledger queries (issue 48): what `reporting.capacity` says per
variant x level label (requests, tokens, peaks, requests in flight, the SLOs' p99s and goodput),
what capacity reads of a variant over every level, the quality score per level, and the traffic
sums, by DuckDB over the ledger (`duck.Duck`) on every level's measured rows: Python gets a row per
level. A mixin of `Ledger` (`AnalysisReads.query`).

A level is a variant's rows with one level label (``level``, 'main' when none), as the report
groups them. A relative SLO divides each request's latency by its case's at concurrency 1 on the
same variant: the level labelled as the reference (a search's `c=1`) where it is one request at a time
on a closed loop, else the first such level the rows show; the reference of (case, repeat) is that
level's last successful request of it with any latency, else the same case's repeat 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlite_utils import Database

from ..catalogue import DERIVED
from .duck import literal

# every level's measured rows of the run, the few columns these queries read (a CTE read twice is
# materialized: all its columns would be held)
_COLUMNS = ("variant", "case_id", "repeat", "seq", "id", "ok", "load_level", "concurrency", "scheduled_ms", "ttft_ms",
            "tpot_ms", "e2e_ms", "prompt_tokens", "completion_tokens", "srv_kv_cache_usage_peak", "srv_running_peak",
            "srv_waiting_peak", "srv_waiting_start", "srv_queue_ms", "srv_preemptions", "mono_start_ms", "replica",
            "designed_shared_tokens", "cached_prompt_tokens", "conversation_id")
_ROWS_SELECT = """
  select {columns}, coalesce(nullif(r.level, ''), 'main') as label, c.complexity as case_complexity,
         {out_tps} as out_tps
  from l.measured r join l.runs u on u.id = r.run_id
  join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
  where r.run_id = $run
""".format(columns=", ".join(f"r.{c}" for c in _COLUMNS), out_tps=next(m.sql for m in DERIVED if m.key == "out_tps"))
_ROWS = f"\nwith rows as ({_ROWS_SELECT})"
_ROWS_VIEW = "create temp view rows as" + _ROWS_SELECT  # a view: each statement scans the columns it names

# each level's requests numbered in send order (1-based), with what over-saturation reads of them
_NUMBERED = """create temp table numbered as
select variant, label, n, mono_start_ms, e2e_ms, scheduled_ms, srv_queue_ms,
       coalesce(srv_waiting_start, srv_waiting_peak) as waiting, ok and mono_start_ms is not null as keeps,
       srv_kv_cache_usage_peak, srv_preemptions
from (select *, row_number() over (partition by variant, label order by seq, id) as n from rows)"""

# the concurrency-1 closed-loop level of each variant a relative SLO divides by, and its latencies
# (a table: the rows join it twice)
_REFERENCE = """create temp table ref as
with closed as (select variant, label, min(seq) as s, min(id) as i from rows group by all
                having max(load_level) = 1 and count(scheduled_ms) = 0),
ref_level as (select variant, arg_min(label, (label <> $reference, s, i)) as label from closed group by variant)
select variant, case_id, repeat, ttft_ms, tpot_ms, e2e_ms from (
  select r.*, row_number() over (partition by r.variant, r.case_id, r.repeat order by r.seq desc, r.id desc) as k
  from rows r join ref_level f using (variant, label) where r.ok)
where k = 1 and coalesce(ttft_ms, tpot_ms, e2e_ms) is not null"""

# each request's pass of the quality score (every pass/fail grade it has)
_QUALITY = """create temp table quality as
select g.request_id, bool_and(g.passed::boolean) as pass from l.grade_latest g
where g.run_id = $run and g.grader in ({graders}) and g.passed is not null group by g.request_id"""

# requests in flight at once, counted per server (each server's clock is its sender's) and summed:
# at a tie the end comes first, so a closed loop's next request is no overlap
_IN_FLIGHT = """
with events as (select variant, label, replica, mono_start_ms as t, 1 as d from lv where mono_start_ms is not null
                union all
                select variant, label, replica, mono_start_ms + coalesce(e2e_ms, 0.0), -1 from lv
                where mono_start_ms is not null),
running as (select variant, label, replica,
                   sum(d) over (partition by variant, label, replica order by t, d rows unbounded preceding) as now
            from events)
select variant, label, sum(top)::bigint as in_flight_peak
from (select variant, label, replica, max(now) as top from running group by all) group by all"""


class LevelReads:
    """The per-level queries."""

    _db: Database
    query: Any  # `AnalysisReads.query`
    queries: Any  # `AnalysisReads.queries`
    session: Any  # `AnalysisReads.session`

    def level_table(self, run_id: str, absolute: dict[str, float], relative: dict[str, float],
                    quality_graders: tuple[str, ...], reference: str = "c=1") -> list[dict[str, Any]]:
        """Per variant x level label, in the order the rows first show them: n, errors, the highest
        concurrency, prompt and output tokens of the successful requests, the server's KV, running
        and waiting peaks, requests in flight (peak; ``busy_ms``: their summed time), the p99 of
        each ``absolute`` SLO's latency and of each ``relative`` one's slowdown over the successful
        requests, ``good``: requests meeting every limit, and the quality score's ``quality_n``
        (successful requests with a pass/fail grade of ``quality_graders``), ``quality_pass`` (those
        passing every one they have) and ``tps_per_user`` (the mean output tokens/s of one request).
        ``reference``: the label of the level a relative SLO prefers to divide by (a search's)."""
        # the levels' rows are a view (each statement scans only the copy's columns it names); the
        # figures are read from one narrow table of what they need, made by one pass with its joins
        # (a wide table a step per join spilled GBs at 10 M rows); a percentile's column at a time
        # (an exact percentile holds every value of its group). A relative SLO: a request's latency
        # over its reference's (none where that is missing or 0).
        lat = sorted({*absolute, *relative, "e2e"})
        slow = "".join(f", case when r.ok and r.{k}_ms is not null then r.{k}_ms / nullif(case when a.case_id is not "
                       f"null then a.{k}_ms else z.{k}_ms end, 0) end as slow_{k}" for k in relative)
        joins = (" left join ref a on a.variant = r.variant and a.case_id = r.case_id and a.repeat = r.repeat"
                 " left join (select * from ref where repeat = 0) z on z.variant = r.variant and z.case_id = r.case_id"
                 if relative else "")
        steps = [_ROWS_VIEW, *([_REFERENCE] if relative else []),
                 _QUALITY.format(graders=", ".join(literal(g) for g in quality_graders) or "null"),
                 "create temp table lv as select r.variant, r.label, r.seq, r.id, r.ok, r.load_level, r.prompt_tokens, "
                 "r.completion_tokens, r.srv_kv_cache_usage_peak, r.srv_running_peak, r.srv_waiting_peak, "
                 f"r.mono_start_ms, r.replica, r.out_tps{''.join(f', r.{k}_ms' for k in lat)}{slow} from rows r{joins}"]
        meets = ["s.ok", *(f"s.{k}_ms is not null and s.{k}_ms <= {literal(float(v))}" for k, v in absolute.items()),
                 *(f"s.slow_{k} is not null and s.slow_{k} <= {literal(float(f))}" for k, f in relative.items())]
        cols = ["s.variant", "s.label", "count(*) as n", "count(*) filter (where not s.ok) as errors",
                "max(s.load_level) as concurrency",
                "coalesce(sum(s.prompt_tokens) filter (where s.ok), 0)::bigint as prompt_tokens",
                "coalesce(sum(s.completion_tokens) filter (where s.ok), 0)::bigint as output_tokens",
                "max(s.srv_kv_cache_usage_peak) as kv_peak", "max(s.srv_running_peak) as running_peak",
                "max(s.srv_waiting_peak) as waiting_peak",
                "sum(coalesce(s.e2e_ms, 0.0)) filter (where s.mono_start_ms is not null) as busy_ms",
                f"count(*) filter (where {' and '.join(meets)}) as good",
                "0 as quality_n", "0 as quality_pass",  # from `quality`'s join, in its own statement
                "avg(s.out_tps) filter (where s.ok) as tps_per_user",
                "min(s.seq) as first_seq", "min(s.id) as first_id"]
        p99 = {**{f"p99_{k}": f"quantile_cont({k}_ms, 0.99) filter (where ok)" for k in absolute},
               **{f"slow_p99_{k}": f"quantile_cont(slow_{k}, 0.99)" for k in relative}}
        got = self.queries([*steps, f"select {', '.join(cols)} from lv s group by s.variant, s.label", _IN_FLIGHT,
                            "select s.variant, s.label, count(*) filter (where s.ok), count(*) filter (where s.ok and q.pass) "
                            "from lv s join quality q on q.request_id = s.id group by all",
                            *(f"select variant, label, {q} from lv group by all" for q in p99.values())],
                           {"run": run_id, "reference": reference})[len(steps):]
        (names, rows), peaks, quality, *quantiles = got
        peak = {(v, lab): p for v, lab, p in peaks[1]}
        scores = {(v, lab): (n, good) for v, lab, n, good in quality[1]}
        at = [{(v, lab): x for v, lab, x in q[1]} for q in quantiles]
        out = []
        for row in sorted(rows, key=lambda r: (r[-2], r[-1])):
            entry = dict(zip(names, row, strict=True))
            key = (entry["variant"], entry["label"])
            for name, values in zip(p99, at, strict=True):
                entry[name] = values.get(key)
            entry["in_flight_peak"] = peak.get(key, 0)
            entry["quality_n"], entry["quality_pass"] = scores.get(key, (0, 0))
            out.append(entry)
        return out

    def level_usage(self, run_id: str, stop_kv: float) -> dict[str, dict[str, Any]]:
        """What capacity reads of each variant over every level: prompt tokens (sum, count) per
        complexity of the requests that sent any, the concurrencies whose requests saw the KV cache
        at ``stop_kv`` or were preempted, and the highest concurrency tested."""
        _, rows = self.query(_ROWS + """
select variant, case_complexity, sum(prompt_tokens)::bigint, count(*) from rows
where coalesce(prompt_tokens, 0) <> 0 and case_complexity in ('short', 'medium', 'long') group by all""",
                             {"run": run_id})
        _, sat = self.query(_ROWS + f"""
select variant, list(distinct concurrency) filter (where coalesce(srv_kv_cache_usage_peak, 0) >= {literal(float(stop_kv))}
                                                    or coalesce(srv_preemptions, 0) > 0), max(load_level)
from rows group by variant""", {"run": run_id})
        out: dict[str, dict[str, Any]] = {v: {"prompt": {}, "saturated": set(s or []), "tested": t} for v, s, t in sat}
        for v, cx, total, n in rows:
            out[v]["prompt"][cx] = [total, n]
        return out

    def level_series(self, run_id: str, thin: Callable[[int, list[int]], list[int]]
                     ) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[tuple[str, str], list[tuple]]]:
        """Per variant x level label, what over-saturation reads of it (`stops.LevelOutcome`, fed the
        level's requests in send order): first ``n`` requests, ``unkept``: the numbers (1-based, in
        send order) of those it keeps no point of (failed, or never sent), ``kv_peak`` and
        ``preemptions_summed``; then the points (sent, end, scheduled, queue time, waiting) of the
        requests numbered ``thin(n, unkept)`` (`stops.thinned`: those it keeps), in that order: all
        Python sees of a level's rows. One session (`session`): the levels' requests are numbered once."""
        with self.session():
            _, levels = self.queries([_ROWS_VIEW, _NUMBERED, """
select variant, label, count(*), coalesce(list(n order by n) filter (where not keeps), []),
       greatest(max(srv_kv_cache_usage_peak), 0.0), coalesce(sum(srv_preemptions) filter (where srv_preemptions <> 0), 0)
from numbered group by all"""], {"run": run_id})[2]
            counts = {(v, lab): {"n": n, "unkept": unkept, "kv_peak": kv, "preemptions_summed": float(pre)}
                      for v, lab, n, unkept, kv, pre in levels}
            kept = {k: thin(c["n"], c["unkept"]) for k, c in counts.items()}
            if not any(kept.values()):
                return counts, {}
            values = ", ".join(f"({literal(v)}, {literal(lab)}, [{', '.join(str(int(i)) for i in ns)}])"
                               for (v, lab), ns in kept.items() if ns)
            _, points = self.query(f"""
select n.variant, n.label, list((n.mono_start_ms, n.mono_start_ms + coalesce(n.e2e_ms, 0.0), n.scheduled_ms,
                                 n.srv_queue_ms, n.waiting) order by n.n)
from numbered n join (select variant, label, unnest(ns) as n from (values {values}) t(variant, label, ns)) k
  on k.variant = n.variant and k.label = n.label and k.n = n.n
group by all""", {"run": run_id})
        return counts, {(v, lab): [tuple(p) for p in pts] for v, lab, pts in points}

    def traffic_sums(self, run_id: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """Per variant, in the order the rows first show them: the prefix sums (`traffic._PREFIX`)
        and the conversations' (conversations, completed, turns, turns failed)."""
        _, pre = self.query(_ROWS + """
select variant,
       count(designed_shared_tokens) filter (where p), coalesce(sum(designed_shared_tokens) filter (where p), 0),
       coalesce(sum(prompt_tokens) filter (where p and designed_shared_tokens is not null), 0),
       count(cached_prompt_tokens) filter (where p), coalesce(bool_or(cached_prompt_tokens <> 0) filter (where p), false),
       coalesce(sum(cached_prompt_tokens) filter (where p), 0),
       coalesce(sum(prompt_tokens) filter (where p and cached_prompt_tokens is not null), 0)
from (select *, ok and coalesce(prompt_tokens, 0) <> 0 as p from rows) group by variant
order by min(seq), min(id)""", {"run": run_id})
        _, conv = self.query(_ROWS + """
select variant, count(*), count(*) filter (where done), sum(turns)::bigint, sum(failed)::bigint from (
  select variant, conversation_id, repeat, bool_and(ok) as done, count(*) as turns,
         count(*) filter (where not ok) as failed, min(seq) as s, min(id) as i
  from rows where coalesce(conversation_id, '') <> '' group by all)
group by variant order by min(s), min(i)""", {"run": run_id})
        return ({v: [int(x) for x in xs] for v, *xs in pre}, {v: [int(x) for x in xs] for v, *xs in conv})

