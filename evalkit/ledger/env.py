"""The machine's load samples (`env_samples`, m023) and what the report reads from them: the rows
of a stretch of a run, and per variant the load while its requests were in flight, joined by
time in SQL. Part of `Ledger` (the one owner of SQL).

A sample covers (t_ms - span_ms, t_ms] on the run's perf_counter clock; a request covers
[mono_start_ms, mono_start_ms + e2e_ms] on the same clock. A sample belongs to a variant when the
two overlap, so a request shorter than the sampling interval still meets the sample around it,
and a sample that several of the variant's requests overlap counts once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .writes import _write

if TYPE_CHECKING:  # `evalkit.stats` brings scipy: imported where the test is asked for
    from ..stats.changepoint import MeanShift

ENV_COLUMNS = ("run_id", "t_ms", "span_ms", "ts", "variant_active", "foreign_cpu", "own_cpu", "server_cpu", "busy_cpu",
               "steal", "iowait", "load1", "cpu_mhz", "mem_pressure", "mem_available_mb", "gpu_sm_clock_ratio",
               "gpu_throttle", "gpu_temp_c", "gpu_power_w", "gpu_foreign_procs", "cpus")
SUMMARISED = ("foreign_cpu", "steal", "iowait")  # mean / p90 / max per variant
SERIES = frozenset(ENV_COLUMNS) - {"run_id", "t_ms", "span_ms", "ts", "variant_active", "cpus"}


def _hits(level: str | None, variant: str | None, block: bool = False) -> tuple[str, dict[str, Any]]:
    """CTEs (DuckDB, the ledger's `l` schema) `reqs` (each measured request's window), `samples`
    (the run's) and `hit` (distinct variant, sample id pairs that overlap; with ``block`` each
    request's `order_block` too): two ranges, so DuckDB joins them by sorting, never each request
    against each sample."""
    where, params = "", {}
    if level is not None:
        where, params["level"] = where + " and coalesce(level, 'main') = $level", level
    if variant is not None:
        where, params["variant"] = where + " and variant = $variant", variant
    blk = (", order_block as blk", " and order_block is not null", " r.blk,") if block else ("", "", "")
    sql = f"""
        with reqs as (
            select variant{blk[0]}, mono_start_ms as a, mono_start_ms + coalesce(e2e_ms, 0.0) as b from l.measured
            where run_id = $run and mono_start_ms is not null{blk[1]}{where}),
        samples as (select * from l.env_samples where run_id = $run),
        longest as (select coalesce(max(span_ms), 0.0) as m from samples),
        hit as (
            select distinct r.variant,{blk[2]} s.id from reqs r cross join longest
            join samples s on s.t_ms > r.a and s.t_ms < r.b + longest.m + 1e-6
                 and s.t_ms - coalesce(s.span_ms, 0.0) < r.b)"""
    return sql, params


def _dicts(got: tuple[list[str], list[tuple[Any, ...]]]) -> list[dict[str, Any]]:
    return [dict(zip(got[0], row, strict=True)) for row in got[1]]


class EnvSamples:
    _db: Any

    @_write
    def insert_env_samples(self, rows: list[dict[str, Any]]) -> None:
        """A batch of load samples in one transaction (the sampler writes every ~10 s)."""
        if not rows:
            return
        sql = (f"insert into env_samples ({', '.join(ENV_COLUMNS)}) "
               f"values ({', '.join('?' for _ in ENV_COLUMNS)})")
        with self._db.conn:
            self._db.conn.executemany(sql, [tuple(r.get(c) for c in ENV_COLUMNS) for r in rows])

    def env_samples(self, run_id: str, start_ms: float | None = None, end_ms: float | None = None
                    ) -> list[dict[str, Any]]:
        """A run's load samples whose t_ms lies in [start_ms, end_ms] (either end open), in time order."""
        return list(self._db.query(
            "select * from env_samples where run_id = :run and (:a is null or t_ms >= :a) "
            "and (:b is null or t_ms <= :b) order by t_ms, id", {"run": run_id, "a": start_ms, "b": end_ms}))

    def env_series(self, run_id: str, variant: str, measure: str = "foreign_cpu", level: str | None = None
                   ) -> list[tuple[float, float]]:
        """(t_ms, value) of one measure over the samples a variant's requests overlapped, in time
        order (nulls left out): the series a change-point test reads."""
        if measure not in SERIES:
            raise UsageError(f"no load measure {measure!r}: one of {', '.join(sorted(SERIES))}")
        cte, params = _hits(level, variant)
        return [(r[0], r[1]) for r in self.query(  # type: ignore[attr-defined]
            f'{cte} select s.t_ms, s."{measure}" from hit h join samples s on s.id = h.id '
            f'where s."{measure}" is not null order by s.t_ms, s.id', {"run": run_id, **params})[1]]

    def env_load(self, run_id: str, level: str | None = None) -> dict[str, dict[str, Any]]:
        """Per variant, the load while its measured requests were in flight: for foreign_cpu, steal
        and iowait the mean, p90 (nearest rank) and max over the overlapping samples (`<m>_mean`,
        `<m>_p90`, `<m>_max`, `<m>_n`); `samples` overlapped, `gpu_samples` with a GPU reading and
        `throttle_share` of those throttled; `first_ms` and `last_ms`, the variant's first send
        and last end (whether two variants ran interleaved or back to back). Variants with
        requests but no samples are there with samples 0 and null figures."""
        cte, params = _hits(level, None)
        p = {"run": run_id, **params}
        out: dict[str, dict[str, Any]] = {}
        for r in _dicts(self.query(  # type: ignore[attr-defined]
                f"{cte} select variant, min(a) as first_ms, max(b) as last_ms from reqs group by variant order by variant", p)):
            out[r["variant"]] = {"variant": r["variant"], "first_ms": r["first_ms"], "last_ms": r["last_ms"], "samples": 0,
                                 "gpu_samples": 0, "throttle_share": None,
                                 **{f"{m}_{k}": None for m in SUMMARISED for k in ("mean", "p90", "max")},
                                 **{f"{m}_n": 0 for m in SUMMARISED}}
        for r in _dicts(self.query(  # type: ignore[attr-defined]
                f"""{cte} select h.variant, count(*) as samples, count(s.gpu_throttle) as gpu_samples,
                           avg(case when s.gpu_throttle is null then null when s.gpu_throttle != 0 then 1.0 else 0.0 end)
                           as throttle_share
                    from hit h join samples s on s.id = h.id group by h.variant""", p)):
            out[r["variant"]].update(r)
        long = " union all ".join(
            f"select h.variant, '{m}' as m, s.{m} as v from hit h join samples s on s.id = h.id where s.{m} is not null"
            for m in SUMMARISED)
        for r in _dicts(self.query(  # type: ignore[attr-defined]
                f"""{cte}, long as ({long}),
                    ranked as (select variant, m, v, row_number() over (partition by variant, m order by v) as rn,
                                      count(*) over (partition by variant, m) as n from long)
                    select variant, m, avg(v) as mean, min(case when rn * 10 >= n * 9 then v end) as p90,
                           max(v) as max, count(*) as n from ranked group by variant, m""", p)):
            for k in ("mean", "p90", "max", "n"):
                out[r["variant"]][f"{r['m']}_{k}"] = r[k]
        return out

    def env_cpus(self, run_id: str) -> int | None:
        """How many CPUs the run's load samples measured (the most any sample did), None before m026."""
        row = self._db.execute("select max(cpus) from env_samples where run_id = ?", [run_id]).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def env_by_block(self, run_id: str) -> list[dict[str, Any]]:
        """Per variant and group of the alternation (`requests.order_block`: a case, or a chunk of a
        loaded level or of `--order blocks`), the mean foreign CPU and steal of the samples its
        requests overlapped, and how many: the two sides of a chunk ran at different moments, and
        a change of the machine between them shows here even when the run's means agree."""
        cte, params = _hits(None, None, block=True)
        return _dicts(self.query(  # type: ignore[attr-defined]
            f"""{cte} select h.variant, h.blk as block, avg(s.foreign_cpu) as foreign_cpu, avg(s.steal) as steal,
                      count(s.foreign_cpu) as samples
               from hit h join samples s on s.id = h.id group by h.variant, h.blk order by h.blk, h.variant""",
            {"run": run_id, **params}))

    def first_level(self, run_id: str) -> str | None:
        """The run's first load level (its lowest concurrency): where its verdicts are read."""
        got = self.query("select coalesce(level, 'main') from l.requests where run_id = $run and is_warmup = 0 "  # type: ignore[attr-defined]
                         "order by concurrency nulls first, seq nulls first limit 1", {"run": run_id})[1]
        return got[0][0] if got else None

    def series_shift(self, run_id: str, field: str, variant: str, min_segment: int = 3) -> MeanShift | None:
        """The CUSUM test (`changepoint.mean_shift`) over one variant's successful final measured
        values of a request column at the run's first level, in send order (`machine.BaseSeries`),
        its sums taken where the rows are: a window numbers the series and keeps each value's
        predecessor, a second one sums S_k. Python sees eight numbers, not the series (2.5 M values
        at 10 M rows)."""
        col = self._column(field)
        got = self.queries([  # type: ignore[attr-defined]
            f"""create temp table x as select row_number() over w as k, v, lag(v) over w as pv
from (select {col} as v, seq, id from l.measured where run_id = $run and ok and coalesce(level, 'main') = $level
      and {col} is not null and variant = $variant) window w as (order by seq nulls first, id)""",
            "create temp table st as select count(*) as n, sum(v) / count(*) as m, "
            "coalesce(sum((v - pv) * (v - pv)), 0) as diff2 from x",
            """create temp table b as select k, a from (
  select x.k, st.n, abs(sum(x.v - st.m) over (order by x.k rows between unbounded preceding and current row)) as a
  from x, st) where k >= $seg and k <= n - $seg order by a desc, k limit 1""",
            """create temp table c as select avg(v) filter (where x.k <= b.k) as before,
  avg(v) filter (where x.k > b.k) as after from x, b""",
            """select st.n, st.diff2, b.k, b.a, c.before, c.after, sum(e * e), coalesce(sum(e * pe), 0) from (
  select v - case when x.k <= b.k then c.before else c.after end as e,
         pv - case when x.k - 1 <= b.k then c.before else c.after end as pe from x, b, c) r, st, b, c
group by all"""],
            {"run": run_id, "level": self.first_level(run_id), "variant": variant, "seg": min_segment})[-1][1]
        from ..stats.changepoint import CusumSums

        if not got or got[0][0] < 2 * max(1, min_segment):
            return None
        n, diff2, k, a, before, after, g0, g1 = got[0]
        return CusumSums(n, diff2, k, a, before, after, g0, g1).shift()

    def aa_cases(self, run_id: str, field: str, variant: str, repeats: int
                 ) -> tuple[bool, bool, list[tuple[str, float, float, Any]]]:
        """The A/A control's pairs of one variant (the baseline) at the run's first level, of its
        successful requests' ``field``: whether it has a noise-floor pass (a repeat from ``repeats``
        on); whether its requests are blocked (`pairing.blocked`: every one in an alternation
        block, some block holding several cases); per case it sent in both (in case order) the
        mean over its noise-floor passes, over its measured repeats, and its first request's block."""
        rows = f"""create temp table m as select case_id, repeat, seq, order_block, {self._column(field)} as value
from l.measured where run_id = $run and ok and coalesce(level, 'main') = $level and {self._column(field)} is not null
  and variant = $variant"""
        (_, floor), (_, blocked), (_, cases) = self.queries([  # type: ignore[attr-defined]
            rows, "select count(*) filter (where repeat >= $reps) > 0 from m",
            """select coalesce(bool_and(order_block is not null), false)
  and exists (select 1 from m group by order_block having count(distinct case_id) > 1) from m""",
            """select case_id, avg(value) filter (where repeat >= $reps), avg(value) filter (where repeat < $reps),
       arg_min(order_block, seq) from m group by case_id
having count(*) filter (where repeat >= $reps) > 0 and count(*) filter (where repeat < $reps) > 0 order by case_id"""],
            {"run": run_id, "level": self.first_level(run_id), "variant": variant, "reps": repeats})[1:]
        return bool(floor[0][0]), bool(blocked[0][0]), cases

    def position_groups(self, run_id: str) -> list[tuple[float, float]]:
        """Per alternation group at the run's first level (in the order of its first send), the mean
        log E2E of its successful requests sent first in it and of those sent later; the groups
        with both. What the position effect tests (reporting/timeshare.py)."""
        _, got = self.query(  # type: ignore[attr-defined]
            """select avg(ln(e2e_ms)) filter (where order_position = 0), avg(ln(e2e_ms)) filter (where order_position <> 0)
from l.measured where run_id = $run and ok and coalesce(level, 'main') = $level and e2e_ms > 0
  and order_block is not null and order_position is not null
group by order_block
having count(*) filter (where order_position = 0) > 0 and count(*) filter (where order_position <> 0) > 0
order by min(seq)""", {"run": run_id, "level": self.first_level(run_id)})
        return got

    def _column(self, field: str) -> str:
        if field not in self._db["requests"].columns_dict:
            raise UsageError(f"no request column {field!r}")
        return f'"{field}"'

    def grade_details(self, run_id: str, grader: str, level: str | None = None) -> list[dict[str, Any]]:
        """A grader's newest grade of each successful final measured request of a level (the first by
        default): variant, case, repeat, value and detail (parsed). What the per-suite accuracy reads."""
        import json

        level = level if level is not None else self.first_level(run_id)
        rows = self._db.query(
            """select r.variant, r.case_id, r.repeat, g.value, g.detail_json from grade_latest g
               join measured r on r.id = g.request_id
               where g.run_id = :run and g.grader = :grader and r.run_id = :run and r.ok
                 and coalesce(r.level, 'main') = :level order by r.seq""",
            {"run": run_id, "grader": grader, "level": level})
        return [{**{k: r[k] for k in ("variant", "case_id", "repeat", "value")},
                 "detail": json.loads(r["detail_json"] or "{}")} for r in rows]
