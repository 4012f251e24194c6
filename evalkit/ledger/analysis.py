"""The report's aggregates as named ledger queries (issue 48), run by DuckDB over the ledger file
(`duck.Duck`): Python gets one row per group, never a row per request.

Every query reads the `measured` view joined to the run's cases. The tables, slices, per-case pairs
and `recommend`'s groups read each variant at its first load level (what the tables and verdicts
compare), the baseline's noise-floor passes (repeats past the run's own) left out; the spikes and the
client lag read every level. Metric expressions come from the catalogue's declarations (`source`
+ `agg`, a derived metric's `sql`), so a new declared metric is computed here without a line of SQL.

Percentiles are DuckDB's `quantile_cont` (linear interpolation between order statistics, the
type-7 rule numpy's default and `stats.percentile` use); the standard deviation is the sample's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from ..catalogue import DERIVED, Metric
from ..errors import UsageError
from .duck import PerGroup, literal, newest_grades

_P = re.compile(r"^p(\d+(?:\.\d+)?)$")
REQUEST_KEYS = ("complexity", "replica", "level", "concurrency")  # a slice key from the row; else a case attribute
_ATTR_FIELDS = ("task", "persona", "candidate", "formality")  # a case without attributes_json: these are its attributes
DESCRIBE = ("n", "mean", "std", "p50", "p90", "p95", "p99", "max")  # `distributions`' figures of each metric
_SQL_OF = {m.key: m.sql for m in DERIVED if m.sql}

# The measured rows of one run at each variant's first level, the baseline's noise-floor passes out
# ($run, $baseline, $repeats), with the case's complexity and attributes and the derived metrics.
_FIRST_LEVEL = """
with firsts as (select variant, min(load_level) as first from l.measured where run_id = $run group by variant),
sel as (
  select r.*, c.complexity as case_complexity, c.attributes_json, {case_fields}{derived}
  from l.measured r join l.runs u on u.id = r.run_id
  join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
  join firsts f on f.variant = r.variant and f.first = r.load_level
  where r.run_id = $run and (r.variant is distinct from $baseline or r.repeat < $repeats)
)"""


def _first_level_sql() -> str:
    """`_FIRST_LEVEL` with the case's attribute fields and the derived metrics' SQL filled in."""
    return _FIRST_LEVEL.format(case_fields=", ".join(f"c.{f} as case_{f}" for f in _ATTR_FIELDS),
                               derived="".join(f", {sql} as {key}" for key, sql in _SQL_OF.items()))


def _source(m: Metric) -> str:
    name = m.source or m.key
    return _SQL_OF.get(name, f'"{name}"')


def _agg(m: Metric, pcts: dict[tuple[str, bool], list[float]], alias: dict[str, str] | None = None) -> str:
    """One declared metric's SQL. A column's percentiles are one `quantile_cont` over the list of
    them (one sort; DuckDB computes an aggregate written twice once), indexed. ``alias``: each
    source's column where the rows were made into a table first (`slice_table`)."""
    if m.agg == "count":
        return "count(*)"
    if m.agg == "errors":
        return "count(*) filter (where not ok)"
    src, only = _source(m), " filter (where ok)" if m.ok_only else ""
    src = alias[src] if alias else src
    if m.agg == "mean":
        return f"avg({src}){only}"
    if m.agg == "max":
        return f"max({src}){only}"
    if m.agg == "max_pct":
        return f"100.0::double * max({src}){only}"
    if m.agg == "positive":
        cond = "ok and " if m.ok_only else ""
        return f"case when count({src}){only} = 0 then null else count(*) filter (where {cond}{src} > 0) end"
    if (p := _P.match(m.agg or "")) is not None:
        qs = pcts[(src, m.ok_only)]
        return f"(quantile_cont({src}, {qs!r}){only})[{qs.index(float(p.group(1)) / 100) + 1}]"
    raise ValueError(f"metric {m.key}: unknown aggregate {m.agg!r}")


def _percentiles(metrics: Sequence[Metric]) -> dict[tuple[str, bool], list[float]]:
    """(source, successful only) -> the percentiles the metrics ask of it, as fractions."""
    pcts: dict[tuple[str, bool], list[float]] = {}
    for m in metrics:
        if (p := _P.match(m.agg or "")) is not None:
            qs = pcts.setdefault((_source(m), m.ok_only), [])
            if (q := float(p.group(1)) / 100) not in qs:
                qs.append(q)
    return pcts


def aggregates(metrics: Sequence[Metric]) -> list[str]:
    """The SQL of each declared metric over a group of `sel`'s rows."""
    pcts = _percentiles(metrics)
    return [_agg(m, pcts) for m in metrics]


_SLICES = "grouping sets ((variant, case_complexity), (variant))"


class AnalysisReads:
    """The named queries, run by this ledger's query worker (`duck_worker`: DuckDB never opens the
    ledger in a process that has its own connection to it). The worker opens DuckDB for each query
    and closes it when done: DuckDB keeps the memory of a query's aggregates in its own allocator
    until closed (~100 MB at a million rows); opening costs ~0.1 s."""

    path: Any
    _worker: Any = None  # its `duck_worker.QueryWorker`, once a query asked for it

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of one analysis query over this ledger (`duck.Duck`: ``l.`` names its tables)."""
        return self._worker_of().columns(sql, params)  # type: ignore[no-any-return]

    def queries(self, sqls: list[str | PerGroup], params: dict[str, Any] | None = None
                ) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
        """`query` of each statement in order on one DuckDB connection: a temp table the first makes
        (in DuckDB's own storage, spilled to disk past its memory limit) the later ones read."""
        return self._worker_of().columns(sqls, params)  # type: ignore[no-any-return]

    def stream(self, sqls: list[str | PerGroup], params: dict[str, Any] | None = None) -> Iterator[tuple[Any, ...]]:
        """The rows of the last of ``sqls`` (`queries`), a part at a time (`QueryWorker.stream`)."""
        return self._worker_of().stream(sqls, params)  # type: ignore[no-any-return]

    def session(self) -> Any:
        """A block whose queries share one DuckDB connection (`QueryWorker.session`): a temp table
        one makes, a later one reads."""
        return self._worker_of().session()

    def first_answers(self, run_id: str) -> list[int]:
        """The answer each (variant, case) pair compares, in id order: at the variant's first load
        level, its lowest repeat, the first sent of it (lowest id), as the divergence grader picks
        them; the comparison view reads these rows, not the run's."""
        _, got = self.query("""
with m as (select r.variant, r.case_id, r.load_level, coalesce(r.repeat, 0) as rep, r.id from l.measured r
           join l.runs u on u.id = r.run_id join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
           where r.run_id = $run),
     p as (select variant, case_id, load_level, arg_min(id, (rep, id)) as id from m group by all)
select id from p where load_level = (select min(load_level) from p q where q.variant = p.variant) order by id""",
                            {"run": run_id})
        return [int(i) for (i,) in got]

    def _worker_of(self) -> Any:
        if self._worker is None:
            from .duck_worker import QueryWorker  # here: only a query needs it

            self._worker = QueryWorker(self.path)
        return self._worker

    def close_worker(self) -> None:
        """Stop the query worker, if one was started (`Ledger.close`)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _first_level(self, run_id: str, baseline: str | None, repeats: int, keys: list[str], select: list[str],
                     group: str, where: str = "true") -> tuple[list[str], list[tuple[Any, ...]]]:
        """``select`` over the first-level rows (those meeting ``where``) grouped by ``group``;
        ``keys``: expressions (with their alias) the grouping names."""
        sql = (_first_level_sql() + f" select {', '.join(select)} from (select {', '.join([*keys, '*'])} from sel"
               f" where {where}) s group by {group}")
        return self.query(sql, {"run": run_id, "baseline": baseline, "repeats": repeats})

    def slice_table(self, run_id: str, baseline: str | None, repeats: int, metrics: Sequence[Metric],
                    slo: dict[str, float]) -> dict[tuple[str, str], dict[str, Any]]:
        """(variant, complexity or "all") -> every metric of ``metrics`` (the catalogue's `REPORT`
        ones with an `agg`), the goodput under ``slo`` (None without one) and the server's timing
        methods, over each variant's first level. The rows' columns are read from the ledger once,
        into a DuckDB table (its storage, spilled to disk past the memory limit); the percentiles
        are then taken a column at a time, so only one column's values are held at once (an exact
        percentile holds every value of its group)."""
        pcts = _percentiles(metrics)
        sources = dict.fromkeys(_source(m) for m in metrics if m.agg not in ("count", "errors"))
        alias = {src: f"s{i}" for i, src in enumerate(sources)}
        kept = [f"{src} as {a}" for src, a in alias.items()] + [_ident(f"{k}_ms") for k in slo
                                                              if _ident(f"{k}_ms") not in sources]
        make = (f"create temp table x as {_first_level_sql()} select variant, case_complexity, ok, srv_method"
                + "".join(f", {c}" for c in kept) + " from sel")
        plain = [m for m in metrics if _P.match(m.agg or "") is None]
        cols = [f"{_agg(m, pcts, alias)} as {_ident(m.key)}" for m in plain]
        meets = " and ".join(f'{alias.get(_ident(f"{k}_ms"), _ident(f"{k}_ms"))} <= {literal(float(v))}'
                             for k, v in slo.items())
        cols.append(f"100.0::double * count(*) filter (where ok and {meets}) / count(*) as goodput_pct" if slo
                    else "null as goodput_pct")
        cols.append("list_sort(list(distinct srv_method) filter (where srv_method is not null "
                    "and srv_method <> '')) as srv_methods")
        head = "select variant, case_complexity, grouping(case_complexity) as whole"
        sqls: list[str | PerGroup] = [make, f"{head}, {', '.join(cols)} from x group by {_SLICES}"]
        for (src, only), qs in pcts.items():
            where = " filter (where ok)" if only else ""
            sqls.append(PerGroup(f"{head}, quantile_cont({alias[src]}, {qs!r}){where} from x where {{batch}} "
                                 f"group by {_SLICES}", "x", ("variant",)))
        _, (names, rows), *quantiles = self.queries(sqls, {"run": run_id, "baseline": baseline, "repeats": repeats})
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            got = dict(zip(names, row, strict=True))
            key = (got.pop("variant"), "all" if got.pop("whole") else got.pop("case_complexity"))
            got.pop("case_complexity", None)
            got["srv_methods"] = got["srv_methods"] or []
            out[key] = got
        for ((src, only), qs), (_, qrows) in zip(pcts.items(), quantiles, strict=True):
            values = {(v, "all" if whole else c): q for v, c, whole, q in qrows}
            for m in metrics:
                if (p := _P.match(m.agg or "")) is not None and (_source(m), m.ok_only) == (src, only):
                    for key, got in out.items():
                        q = values.get(key)
                        got[m.key] = None if q is None else q[qs.index(float(p.group(1)) / 100)]
        return {k: {m.key: got.get(m.key) for m in metrics} | {x: got[x] for x in ("goodput_pct", "srv_methods")}
                for k, got in out.items()}

    def slice_keys(self, run_id: str, baseline: str | None, repeats: int) -> list[str]:
        """The case attributes a first-level row carries (what `--by` may name besides `REQUEST_KEYS`)."""
        attrs = "coalesce(nullif(attributes_json, ''), json_object(" + ", ".join(f"'{f}', case_{f}" for f in _ATTR_FIELDS) + "))"
        _, rows = self._first_level(run_id, baseline, repeats, [f"unnest(json_keys({attrs})) as k"], ["k"], "k")
        return sorted(r[0] for r in rows)

    def distributions(self, run_id: str, baseline: str | None, repeats: int, by: list[str],
                      fields: Sequence[Metric]) -> list[dict[str, Any]]:
        """Per variant x value(s) of ``by`` over each variant's first level: n, errors, and per metric
        its n, mean, std, p50, p90, p95, p99 and max over the successful requests."""
        known = self.slice_keys(run_id, baseline, repeats)
        bad = [b for b in by if b not in REQUEST_KEYS and b not in known]
        if bad:
            raise UsageError(f"--by: unknown slice field(s) {', '.join(bad)} (known: {', '.join([*REQUEST_KEYS, *known])})")
        keys = [_key_sql(b, i) for i, b in enumerate(by)]
        cols = ["variant", *(f"by{i}" for i in range(len(by))), "count(*)", "count(*) filter (where not ok)"]
        alias = {src: f"s{i}" for i, src in enumerate(dict.fromkeys(_source(m) for m in fields))}
        for m in fields:
            src = alias[_source(m)]
            q = f"(quantile_cont({src}, [0.5, 0.9, 0.95, 0.99]) filter (where ok))"
            cols += [f"count({src}) filter (where ok)", f"avg({src}) filter (where ok)",
                     f"stddev_samp({src}) filter (where ok)", *(f"{q}[{i}]" for i in range(1, 5)),
                     f"max({src}) filter (where ok)"]
        group = ["variant", *(f"by{i}" for i in range(len(by)))]
        *_, (_, rows) = self.queries([  # the rows' keys made once; the percentiles a batch of slices at a time
            f"create temp table d as {_first_level_sql()} select "
            + ", ".join(["variant", *keys, "ok", *(f"{src} as {a}" for src, a in alias.items())]) + " from sel",
            PerGroup(f"select {', '.join(cols)} from d where {{batch}} group by {', '.join(group)}", "d", tuple(group))],
            {"run": run_id, "baseline": baseline, "repeats": repeats})
        out = []
        for row in rows:
            entry: dict[str, Any] = {"variant": row[0], **{b: _value(b, row[1 + i]) for i, b in enumerate(by)},
                                     "n": row[1 + len(by)], "errors": row[2 + len(by)]}
            at = 3 + len(by)
            for m in fields:
                entry[m.key] = dict(zip(DESCRIBE, row[at:at + len(DESCRIBE)], strict=True))
                at += len(DESCRIBE)
            out.append(entry)
        return sorted(out, key=lambda e: tuple(str(e[k]) for k in ["variant", *by]))

    def first_level_values(self, run_id: str, baseline: str | None, repeats: int, groups: dict[str, str],
                           metrics: list[str]) -> list[dict[str, Any]]:
        """Per group (name -> its SQL condition on `case_complexity`) x variant over each variant's
        first level: n, errors, and each metric's successful values in send order (a percentile's
        bootstrap resamples them: the one column Python holds)."""
        cols = ["variant", "count(*)", "count(*) filter (where not ok)",
                *(f"list({_ident(m)} order by seq, id) filter (where ok and {_ident(m)} is not null)" for m in metrics)]
        got = {}
        for name, cond in groups.items():
            _, rows = self._first_level(run_id, baseline, repeats, [], cols, "variant", where=cond)
            got.update({(name, v): {"group": name, "variant": v, "n": n, "errors": e,
                                    **dict(zip(metrics, (x or [] for x in xs), strict=True))} for v, n, e, *xs in rows})
        variants = sorted({v for _, v in got})  # a group a variant has no request in: n 0
        return [got.get((g, v)) or {"group": g, "variant": v, "n": 0, "errors": 0, **{m: [] for m in metrics}}
                for g in groups for v in variants]

    def grader_summaries(self, run_id: str, baseline: str | None, repeats: int, declared: dict[str, dict[str, str]]
                         ) -> tuple[dict[tuple[str, str], dict[str, dict[str, Any]]], int]:
        """((variant, complexity or "all") -> grader -> its declared summary (`Aggregate.summary_sql`)
        over the newest grades of each variant's first level, the baseline's noise-floor passes
        out; the baseline's noise-floor requests there): the quality table where the grades are.
        A slice without a grader's grades has no entry for it."""
        steps = [f"create temp table fl as {_first_level_sql()} select id, variant, case_complexity from sel",
                 """select count(*) from l.measured r join l.runs u on u.id = r.run_id
  join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
  where r.run_id = $run and r.variant = $baseline and r.repeat >= $repeats
  and r.load_level = (select min(load_level) from l.measured where run_id = $run and variant = $baseline)"""]
        for g, exprs in declared.items():
            cols = ", ".join(f"{sql} as {_ident(k)}" for k, sql in exprs.items())
            steps.append(f"""select s.variant, s.case_complexity, grouping(s.case_complexity) as whole{', ' if cols else ''}{cols}
from fl s join l.grades g on g.request_id = s.id
where {newest_grades([g])}
group by grouping sets ((s.variant, s.case_complexity), (s.variant))""")
        got = self.queries(steps, {"run": run_id, "baseline": baseline, "repeats": repeats})
        out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for g, (names, rows) in zip(declared, got[2:], strict=True):
            for v, cx, whole, *vals in rows:
                if whole or cx is not None:
                    out.setdefault((v, "all" if whole else cx), {})[g] = dict(zip(names[3:], vals, strict=True))
        return out, int(got[1][1][0][0])

    def case_pairs(self, run_id: str, baseline: str, repeats: int, metric: str) -> list[tuple[str, str, Any, float, float]]:
        """(candidate, case, complexity, its mean, the baseline's mean) of ``metric`` per case over each
        variant's first level, for the report's paired tests: a case of a candidate's whose (case,
        repeat) the baseline sent too, each side's successful repeats averaged over the repeats both
        sent (the baseline's noise-floor passes are no cases); a mean is None where that side has
        no successful request. Ordered by candidate and case."""
        return self.case_pairs_many(run_id, baseline, repeats, [metric])[metric]

    def case_pairs_many(self, run_id: str, baseline: str, repeats: int, metrics: Sequence[str]
                        ) -> dict[str, list[tuple[str, str, Any, float, float]]]:
        """`case_pairs` of each of ``metrics``, from one pass over the rows."""
        ms = [_ident(m) for m in metrics]
        mine = ", ".join(f"avg(c.{m}) filter (where c.ok) as a{i}" for i, m in enumerate(ms))
        theirs = ", ".join(f"avg(r.{m}) filter (where r.ok) as b{i}" for i, m in enumerate(ms))
        _, rows = self.query(_first_level_sql() + f"""
, base_keys as (select distinct case_id, repeat from sel where variant = $baseline),
cand as (select * from sel where variant <> $baseline),
shared as (select distinct variant, repeat from cand where repeat in (select repeat from base_keys)),
member as (select distinct c.variant, c.case_id, c.case_complexity from cand c join base_keys k using (case_id, repeat)),
a as (select c.variant, c.case_id, {mine} from cand c join shared s using (variant, repeat) group by all),
b as (select s.variant, r.case_id, {theirs} from sel r join shared s using (repeat)
      where r.variant = $baseline group by all)
select m.variant, m.case_id, m.case_complexity, {', '.join(f'a.a{i}, b.b{i}' for i in range(len(ms)))}
from member m left join a using (variant, case_id) left join b using (variant, case_id)
order by m.variant, m.case_id""", {"run": run_id, "baseline": baseline, "repeats": repeats})
        return {m: [(r[0], r[1], r[2], r[3 + 2 * i], r[4 + 2 * i]) for r in rows] for i, m in enumerate(metrics)}

    def client_lag_p99(self, run_id: str) -> dict[str, tuple[float | None, bool]]:
        """Per variant over every level: the p99 of its requests' client event-loop lag, and whether
        every one was stamped by the kernel (`evalkit check --max-client-lag-ms`)."""
        _, rows = self.query("select variant, quantile_cont(client_lag_max_ms, 0.99), "
                             "bool_and(coalesce(timestamp_source = 'kernel', false)) from l.measured r "
                             "join l.runs u on u.id = r.run_id join l.cases c on c.id = r.case_id "
                             "and c.dataset_hash = u.dataset_hash where r.run_id = $run group by variant",
                             {"run": run_id})
        return {v: (p99, bool(kernel)) for v, p99, kernel in rows}

    def level_marks(self, run_id: str) -> dict[str, tuple[int, set[str], int]]:
        """Per load level label (in the order the measured rows first show it): its rows, the clocks
        that stamped them (`timestamp_source`, "user" when none), and how many are marked
        `timing_suspect`: the client's self-check (`report.client_check`)."""
        _, rows = self.query("select coalesce(nullif(r.level, ''), 'main'), count(*), "
                             "list(distinct coalesce(nullif(r.timestamp_source, ''), 'user')), "
                             "count(*) filter (where coalesce(r.timing_suspect, 0) != 0) from l.measured r "
                             "join l.runs u on u.id = r.run_id join l.cases c on c.id = r.case_id "
                             "and c.dataset_hash = u.dataset_hash where r.run_id = $run group by 1 "
                             "order by min({'k': r.seq is not null, 's': r.seq, 'i': r.id})", {"run": run_id})
        return {lv: (int(n), set(src), int(sus)) for lv, n, src, sus in rows}

    def spike_rows(self, run_id: str, metric: str, k: float) -> Iterator[dict[str, Any]]:
        """`_SPIKES` of ``metric``, each attributed in Python (`findings.attribute_spike`): a dict a
        row as the caller takes it, streamed (132,000 spikes at 10 M rows), so no query may run on
        this ledger until it is read."""
        if metric not in ("ttft_ms", "e2e_ms"):
            raise ValueError(f"no spikes of {metric!r}")
        rows = self.stream([str(_SPIKE_STEPS[0]).format(metric=metric), *_SPIKE_STEPS[1:], _SPIKES], {
            "run": run_id, "k": float(k), "c": 1.4826, "low": 0.01, "rel": 1 + SPIKE_MIN_EXCESS[0],
            "abs": SPIKE_MIN_EXCESS[1]})
        return (dict(zip(SPIKE_FIELDS, r, strict=True)) for r in rows)


def _ident(key: str) -> str:
    return '"' + key.replace('"', '""') + '"'


def _key_sql(key: str, i: int) -> str:
    """A slice key's value in `sel`: a request field, else the case attribute's JSON text."""
    if key == "complexity":
        return f"case_complexity as by{i}"
    if key in REQUEST_KEYS:
        return f"{_ident(key)} as by{i}"
    path = "'$." + json.dumps(key).replace("'", "''") + "'"
    fallback = f"to_json(case_{key})::varchar" if key in _ATTR_FIELDS else "null"
    return (f"case when nullif(attributes_json, '') is null then {fallback} "
            f"else json_extract(attributes_json, {path})::varchar end as by{i}")


def _value(key: str, raw: Any) -> Any:
    """A group's key as the rows gave it: an attribute parsed from its JSON (a dict or a list as
    sorted JSON text, so it compares)."""
    if key in REQUEST_KEYS or raw is None:
        return raw
    v = json.loads(raw)
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v


# A spike must also stand out in absolute terms: 10 % and 1 ms above its slice's median (where the
# spread is near zero, a stub server or a cached answer, the robust z of a 1 ms wiggle is large,
# but the request was not slow).
SPIKE_MIN_EXCESS = (0.10, 1.0)
SPIKE_FIELDS = ("id", "variant", "load_level", "complexity", "case_id", "seq", "value", "median", "scale",
                "prefill_median", "first_seq", "srv_preemptions", "srv_queue_ms", "srv_waiting_start",
                "srv_prefill_ms", "srv_running_start", "srv_method")

# Requests far above their slice (variant x level x complexity) over every level: above the median
# + k x the robust scale (1.4826 MAD, floored at 1 % of the median) and the absolute floor, in slices
# of at least 5 successful requests; with what `attribute_spike` weighs them by.
# Step by step, each a table in DuckDB's own storage (spilled past its memory limit): the slices' rows
# read from the ledger once, their medians, their MADs, the spikes.
_SLICE = ("variant", "load_level", "complexity")
_SPIKE_STEPS: list[str | PerGroup] = [
    """create temp table sr as
select r.id, r.variant, r.load_level, coalesce(nullif(c.complexity, ''), 'all') as complexity, r.case_id, r.seq,
       r."{metric}" as value, r.srv_preemptions, r.srv_queue_ms, r.srv_waiting_start, r.srv_prefill_ms,
       r.srv_running_start, r.srv_method
from l.measured r join l.runs u on u.id = r.run_id
join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
where r.run_id = $run and r.ok and r."{metric}" is not null""",
    PerGroup("""select variant, load_level, complexity, count(*) as n, quantile_cont(value, 0.5) as median,
       quantile_cont(srv_prefill_ms, 0.5) as prefill_median from sr where {batch} group by all""", "sr", _SLICE, "med"),
    PerGroup("""select s.variant, s.load_level, s.complexity,
       quantile_cont(abs(s.value - m.median), 0.5) as mad from sr s join med m using (variant, load_level, complexity)
where {batch} group by all""", "sr", _SLICE, "mad"),
]
_SPIKES = """
with firsts as (select variant, min(seq) as first_seq from l.measured where run_id = $run group by variant)
select s.id, s.variant, s.load_level, s.complexity, s.case_id, s.seq, s.value, m.median,
       greatest($c * d.mad, $low * abs(m.median), 1e-9) as scale, m.prefill_median, f.first_seq,
       s.srv_preemptions, s.srv_queue_ms, s.srv_waiting_start, s.srv_prefill_ms, s.srv_running_start, s.srv_method
from sr s join med m using (variant, load_level, complexity) join mad d using (variant, load_level, complexity)
join firsts f using (variant)
where m.n >= 5 and s.value > m.median + $k * greatest($c * d.mad, $low * abs(m.median), 1e-9)
  and s.value >= greatest(m.median * $rel, m.median + $abs)
order by s.variant, s.load_level, s.complexity, s.seq, s.id"""

