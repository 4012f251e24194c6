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

from collections.abc import Iterator
from typing import Any

from sqlite_utils import Database

from ..catalogue import DERIVED
from .duck import literal

# every level's measured rows of the run, the few columns these queries read (a CTE read twice is
# materialized: all its columns would be held)
_COLUMNS = ("variant", "case_id", "repeat", "seq", "id", "ok", "load_level", "concurrency", "scheduled_ms", "ttft_ms",
            "tpot_ms", "e2e_ms", "prompt_tokens", "completion_tokens", "srv_kv_cache_usage_peak", "srv_running_peak",
            "srv_waiting_peak", "srv_preemptions", "mono_start_ms", "replica", "designed_shared_tokens",
            "cached_prompt_tokens", "conversation_id")
_ROWS_SELECT = """
  select {columns}, coalesce(nullif(r.level, ''), 'main') as label, c.complexity as case_complexity,
         {out_tps} as out_tps
  from l.measured r join l.runs u on u.id = r.run_id
  join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
  where r.run_id = $run
""".format(columns=", ".join(f"r.{c}" for c in _COLUMNS), out_tps=next(m.sql for m in DERIVED if m.key == "out_tps"))
_ROWS = f"\nwith rows as ({_ROWS_SELECT})"

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
        # the levels' rows read from the ledger once, step by step into DuckDB tables (its storage,
        # spilled to disk past the memory limit, where a CTE read several times is held whole); each
        # figure from there, a percentile's column at a time (an exact percentile holds every value
        # of its group). A relative SLO: a request's latency over its reference's (none where that is
        # missing or 0).
        slow = ", ".join(f"case when r.ok and r.{k}_ms is not null then r.{k}_ms / nullif(case when r.has_a then "
                         f"r.a_{k}_ms else z.{k}_ms end, 0) end as slow_{k}" for k in relative)
        # one join a step: three hash tables in one pipeline ran past the memory limit at 1 M rows
        with_ref = [
            "create temp table ra as select r.*, a.case_id is not null as has_a"
            + "".join(f", a.{k}_ms as a_{k}_ms" for k in relative) + " from rows r left join ref a "
            "on a.variant = r.variant and a.case_id = r.case_id and a.repeat = r.repeat",
            f"create temp table rz as select r.* exclude (has_a{''.join(f', a_{k}_ms' for k in relative)}), {slow} "
            "from ra r left join ref z on z.variant = r.variant and z.case_id = r.case_id and z.repeat = 0"]
        steps = ["create temp table rows as" + _ROWS_SELECT, *([_REFERENCE, *with_ref] if relative else []),
                 _QUALITY.format(graders=", ".join(literal(g) for g in quality_graders) or "null"),
                 f"create temp table lv as select r.*, q.pass from {'rz' if relative else 'rows'} r "
                 "left join quality q on q.request_id = r.id"]
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
                "count(s.pass) filter (where s.ok) as quality_n",
                "count(*) filter (where s.ok and s.pass) as quality_pass",
                "avg(s.out_tps) filter (where s.ok) as tps_per_user",
                "min(s.seq) as first_seq", "min(s.id) as first_id"]
        p99 = {**{f"p99_{k}": f"quantile_cont({k}_ms, 0.99) filter (where ok)" for k in absolute},
               **{f"slow_p99_{k}": f"quantile_cont(slow_{k}, 0.99)" for k in relative}}
        got = self.queries([*steps, f"select {', '.join(cols)} from lv s group by s.variant, s.label", _IN_FLIGHT,
                            *(f"select variant, label, {q} from lv group by all" for q in p99.values())],
                           {"run": run_id, "reference": reference})[len(steps):]
        (names, rows), peaks, *quantiles = got
        peak = {(v, lab): p for v, lab, p in peaks[1]}
        at = [{(v, lab): x for v, lab, x in q[1]} for q in quantiles]
        out = []
        for row in sorted(rows, key=lambda r: (r[-2], r[-1])):
            entry = dict(zip(names, row, strict=True))
            key = (entry["variant"], entry["label"])
            for name, values in zip(p99, at, strict=True):
                entry[name] = values.get(key)
            entry["in_flight_peak"] = peak.get(key, 0)
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

    def level_series(self, run_id: str, variant: str, label: str, size: int = 20_000) -> Iterator[dict[str, Any]]:
        """One level's requests in send order with what over-saturation reads (`stops.LevelOutcome`),
        a chunk at a time: a few columns, not the rows."""
        names = ["mono_start_ms", "e2e_ms", "error_class", "scheduled_ms", "srv_queue_ms", "srv_waiting_start",
                 "srv_waiting_peak", "replica", "srv_kv_cache_usage_peak", "srv_preemptions", "prompt_tokens"]
        cur = self._db.execute(
            f"""select {', '.join(f'r.[{c}]' for c in names)} from measured r join runs u on u.id = r.run_id
                join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
                where r.run_id = ? and r.variant = ? and coalesce(nullif(r.level, ''), 'main') = ?
                order by r.seq, r.id""", [run_id, variant, label])
        while chunk := cur.fetchmany(size):
            for row in chunk:
                yield dict(zip(names, row, strict=True))

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

