"""Per-case quality values as ledger queries (issue 48): each side of a grader's margin computed
from its `CaseValue` declarations by DuckDB over the ledger file (`duck.Duck`), and paired there, so
Python gets one vector of differences per margin (for its bootstrap) and never a grade. A mixin of
`Ledger` (`AnalysisReads.query`).

Quality under load pairs a variant's answers at its highest load level with its answers sent one
at a time (the same case and repeat): the loaded side is its successful requests at the highest
level it reached, the unloaded side its successful closed-loop requests of concurrency 1, those of
the level labelled as the reference (a search's `c=1`) where it has one. A variant with no level
above 1, or none sent one at a time, has no entry.

Flips compare each candidate's pass/fail per case with the baseline's, at each variant's first
level: a case's pass is its lowest repeat's with one (the first sent on a tie), of the grader or of
one of its rules (`detail.rules.NAME.passed`); the baseline's noise floor is the same against its own
first noise-floor pass (a repeat no candidate sent)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ..catalogue import CaseValue
from .analysis import _ATTR_FIELDS, _first_level_sql, _key_sql, _value
from .duck import literal, newest_grades

# the run's successful requests, a table the steps after it read (a CTE read several times is held
# whole; a table spills to disk past DuckDB's memory limit)
_OK = """create temp table ok as
select r.id, r.seq, r.variant, r.case_id, r.repeat, r.load_level, r.level, r.scheduled_ms
from l.measured r join l.runs u on u.id = r.run_id
join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
where r.run_id = $run and r.ok"""

_SIDES = """
with tops as (select variant, max(load_level) as top from ok group by variant having max(load_level) > 1),
one as (select o.* from ok o join tops using (variant) where o.load_level = 1 and o.scheduled_ms is null),
refs as (select distinct variant from one where level = $reference),
both_sides as (
  select o.*, false as loaded from one o where o.level = $reference or o.variant not in (select variant from refs)
  union all
  select o.*, true from ok o join tops t on t.variant = o.variant and o.load_level = t.top),
entries as (select variant, max(load_level) as top from both_sides group by variant
            having bool_or(loaded) and bool_or(not loaded)),
sides as (select s.* from both_sides s semi join entries using (variant))"""

# the `load_drift` grader's grades of the loaded side: byte-identical answers and their drift
_ENTRIES = _SIDES + """,
drift as (select s.variant, count(*) as n, count(*) filter (where coalesce(g.passed, 0) <> 0) as same,
                 fsum(try_cast(json_extract(g.detail_json, '$.drift') as double)) as total,
                 count(try_cast(json_extract(g.detail_json, '$.drift') as double)) as counted
          from sides s join l.grade_latest g on g.request_id = s.id
          where s.loaded and g.grader = 'load_drift' group by s.variant)
select e.variant, e.top, coalesce(d.n, 0), coalesce(d.same, 0), d.total, coalesce(d.counted, 0)
from entries e left join drift d using (variant)"""

# Each step below is a table in DuckDB's own storage, spilled to disk past its memory limit (a CTE
# read twice is held whole, and at a million rows the pairs' did not fit): the two sides' requests;
# each (side, case#repeat) reduced to one value of each margin (`mm`: the margins, numbered); that
# value also under NAME:SUITE where declared; the sides paired.
# A (side, case#repeat) sent once (nearly all) is its one grade's value, straight from the join of
# the grades; those sent more than once (`dups`, found a hash part at a time: in one, 10 M keys ran
# out of the 128 MB pool) have their grades kept (`gv`: none, at once, when there are none) and are
# reduced by a window (a first) or a mean, a part at a time (`_PARTS`: over every key at 10 M
# requests, 30 M grades with a margin, one part ran out of the pool, 2 fit (90 s), 4 took 107 s,
# 16 took 148 s). At 10 M requests, 22 M graded: 50 s, 63 s with every grade kept first.
_PARTS = 2
_DUP_PARTS = 4
_DUP_KEYS = "d.variant = s.variant and d.loaded = s.loaded and d.case_id = s.case_id and d.repeat = s.repeat"
# each margin's value of each grade of the sides' requests in ``{sides}``: built on the requests (a
# few columns), probed with the grades (their texts too)
_GRADED = """select s.variant, s.loaded, s.case_id, s.repeat, s.seq, s.id, mm.o, mm.first,
         case mm.o {values} end as x, case mm.o {suites} end as suite
  from l.grade_latest g join {sides} s on s.id = g.request_id join mm on mm.grader = g.grader"""
_PAIR_STEPS = [  # after `_OK`, on its connection
    # ``dup``: a side's case#repeat sent more than once (few or none): only those need a first or a mean
    "create temp table sd as " + _SIDES + " select id, seq, variant, loaded, case_id, repeat from sides",
    "create temp table dups as select variant, loaded, case_id, repeat from sd where false",
    *(f"insert into dups select variant, loaded, case_id, repeat from sd where hash(case_id, repeat) % {_DUP_PARTS} = "
      f"{part} group by all having count(*) > 1" for part in range(_DUP_PARTS)),
    "create temp table mm as select * from (values {margins}) t(o, grader, m, first)",
    f"""create temp table gv as select *, (hash(case_id, repeat) % {_PARTS})::integer as part from (
  {_GRADED.replace("{sides}", f"(select s.* from sd s semi join dups d on {_DUP_KEYS})")}) where x is not null""",
    "create temp table per (variant varchar, loaded boolean, o integer, case_id varchar, repeat bigint, seq bigint, "
    "id bigint, v double, suite varchar)",
    # a case#repeat sent once: its one value is its first and its mean
    f"""insert into per select variant, loaded, o, case_id, repeat, seq, id, x, case when first then suite end from (
  {_GRADED.replace("{sides}", f"(select s.* from sd s anti join dups d on {_DUP_KEYS})")}) where x is not null""",
    # a first-repeat margin's value is its first grade's (as sent: a window), a mean margin's the
    # mean; in parts by case#repeat (`_PARTS`), which no window or group spans
    *(f"""insert into per
select variant, loaded, o, case_id, repeat, seq, id, x, suite from (
  select *, row_number() over (partition by variant, loaded, o, case_id, repeat order by seq, id) as k
  from gv where first and part = {part})
where k = 1
union all
select variant, loaded, o, case_id, repeat, min(seq), min(id), avg(x), null from gv
where not first and part = {part} group by all""" for part in range(_PARTS)),
    # the sides paired per case#repeat, each margin also under NAME:SUITE where both sides' suites
    # agree; the differences as distinct values and how often each came: a bootstrap needs no more
    """with pairs as (
  select a.variant, a.o, a.v - b.v as d, a.seq, a.id, a.suite, a.suite = b.suite as same_suite
  from per a join per b on a.variant = b.variant and a.o = b.o and a.case_id = b.case_id and a.repeat = b.repeat
  where a.loaded and not b.loaded),
named as (select variant, o, 0 as part, null::varchar as suite, d, seq, id from pairs
          union all
          select variant, o, 1, suite, d, seq, id from pairs where same_suite),
counted as (select variant, o, part, suite, d, count(*) as n, min(seq) as seq, min(id) as id from named group by all)
select c.variant, case when c.part = 0 then mm.m else mm.m || ':' || c.suite end as m, list(d order by d),
       list(n order by d), min(c.o), min(c.part), min(c.seq), min(c.id)
from counted c join mm using (o)
group by c.variant, c.o, c.part, c.suite, mm.m order by c.variant, 5, 6, 7, 8""",
]

_GRADES = _SIDES + """
select s.variant, s.loaded, g.request_id, g.grader, g.grader_version, g.value, g.passed, g.explanation, g.detail_json,
       s.case_id || '#' || s.repeat
from sides s join l.grade_latest g on g.request_id = s.id where g.grader = $grader order by s.variant, s.loaded, s.seq, s.id"""

_SUITE = ("coalesce(nullif(json_extract_string(g.detail_json, '$.suite'), ''), case when s.case_id like 'suite/%/%' "
          "then split_part(s.case_id, '/', 2) else '?' end)")


# Flips, step by step as the pairs are: each variant's first level, lean, with the slice keys of
# `_key_sql` ($repeats: the baseline's repeats from there on are noise-floor passes, left out); their
# grades' passes and rules' passes; each case's first pass per variant, grader and rule, and the
# baseline's from its first noise-floor pass on; the counts.
_FLIP_STEPS = [
    """create temp table sel as
with firsts as (select variant, min(load_level) as first from l.measured where run_id = $run group by variant),
sel0 as (
  select r.id, r.seq, r.variant, r.case_id, r.repeat, r.replica, r.level, r.concurrency, c.complexity as case_complexity,
         c.attributes_json, {case_fields}
  from l.measured r join l.runs u on u.id = r.run_id
  join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
  join firsts f on f.variant = r.variant and f.first = r.load_level
  where r.run_id = $run and (r.variant is distinct from $baseline or r.repeat < $repeats))
select id, seq, variant, case_id, repeat, {keys} from sel0""",
    """create temp table graded as select s.id, s.seq, s.variant, s.case_id, s.repeat, {s_gk}, x.grader, x.passed,
       case when json_type(x.detail_json, '$.rules') = 'OBJECT' then json_extract(x.detail_json, '$.rules') end as rules
from sel s join l.grade_latest x on x.request_id = s.id where x.grader in ({graders})""",
    """create temp table val as
select id, seq, variant, case_id, repeat, {gk}, grader, null::varchar as rule,
       case when passed is null then null else passed <> 0 end as ok from graded
union all
select id, seq, variant, case_id, repeat, {gk}, grader, e.key, {truthy} from (
  select *, unnest(map_entries(json_transform(rules, '"MAP(VARCHAR, JSON)"'))) as e from graded where rules is not null)""",
    """create temp table reps as select distinct {gk}, variant, repeat from sel""",
    """create temp table floor as select {gk}, min(repeat) as fr from reps b where variant = $baseline
  and not exists (select 1 from reps o where o.variant <> $baseline and o.repeat = b.repeat and {same_o})
  and exists (select 1 from reps o where o.variant <> $baseline and {same_o}) group by all""",
    """create temp table p0 as select {gk}, variant, grader, rule, case_id, ok from (
  select *, row_number() over (partition by {gk}, variant, grader, rule, case_id order by repeat, seq, id) as k
  from val where ok is not null) where k = 1""",
    """create temp table pf as select {gk}, grader, rule, case_id, ok from (
  select v.*, row_number() over (partition by {v_gk}, v.grader, v.rule, v.case_id order by v.repeat, v.seq, v.id) as k
  from val v join floor f on {same_vf} where v.variant = $baseline and v.ok is not null and v.repeat >= f.fr)
where k = 1""",
    """select {c_gk}, c.variant, c.grader, c.rule, count(*), count(*) filter (where c.ok and not b.ok),
       count(*) filter (where b.ok and not c.ok), null, null
from p0 c join p0 b on b.variant = $baseline and c.variant <> $baseline and {same_cb} and b.grader = c.grader
  and b.rule is not distinct from c.rule and b.case_id = c.case_id
group by all
union all
select {b_gk}, null, b.grader, b.rule, null, null, null, count(*), count(*) filter (where b.ok <> f.ok)
from p0 b join pf f on {same_bf} and b.grader = f.grader and b.rule is not distinct from f.rule
  and b.case_id = f.case_id
where b.variant = $baseline group by all""",
]

# a JSON value's truth as Python's `bool` reads it (`null`: no pass)
_TRUTHY = ("case when json_extract_string(e.value, '$.passed') is null then null "
           "else json_extract_string(e.value, '$.passed') not in ('false', '0', '0.0', '', '[]', '{}') end")


def _same(a: str, b: str, gk: list[str]) -> str:
    return " and ".join(f"{a}.{k} is not distinct from {b}.{k}" for k in gk)


def value_sql(v: CaseValue) -> str:
    """A `CaseValue`'s value of one grade ``g`` as SQL: a number, or NULL where the grade has none."""
    if v.source == "value":
        x = "g.value"
    elif v.source == "passed":
        x = "case when g.passed is null then null when g.passed <> 0 then 1.0 else 0.0 end"
    else:  # the key's letters are checked where it is declared
        x = f"try_cast(json_extract(g.detail_json, '$.{v.source.removeprefix('detail.')}') as double)"
    if v.absolute:
        x = f"abs({x})"
    if v.where:
        cond = " and ".join(f"json_extract_string(g.detail_json, '$.{k}') = {literal(t)}" for k, t in v.where)
        x = f"case when {cond} then {x} end"
    return x


# Each margin's per-case value of each side, from a table `sg` of graded rows (k: the pair, or 0;
# b: the baseline's side; variant, case_id, repeat, seq, id, grader, value, passed, detail_json):
# a case's value is its grades' mean, or (`first`) its lowest repeat's, the first sent on a tie;
# the last statement answers (k, variant, margin, case, value), a `by_suite` margin also per suite.
MARGIN_STEPS = [
    "create temp table mm as select * from (values {margins}) t(o, grader, m, first)",
    """create temp table gv as select * from (
  select g.k, g.variant, g.case_id, g.repeat, g.seq, g.id, mm.o, mm.first,
         case mm.o {values} end as x, case mm.o {suites} end as suite
  from sg g join mm on mm.grader = g.grader) where x is not null""",
    # a case's first grade by `arg_min_null` (a hash aggregate over a few hundred groups: a window
    # sorted every graded row); in the order the window gave
    """create temp table per as
select * from (select k, variant, o, case_id, arg_min_null(x, (repeat, seq, id)) as v,
                      arg_min_null(suite, (repeat, seq, id)) as suite
               from gv where first group by k, variant, o, case_id order by k, variant, o, case_id)
union all
select k, variant, o, case_id, avg(x), null from gv where not first group by k, variant, o, case_id""",
    """select p.k, p.variant, mm.m, p.case_id, p.v from per p join mm using (o)
union all
select p.k, p.variant, mm.m || ':' || p.suite, p.case_id, p.v from per p join mm using (o) where p.suite is not null""",
]


def margin_steps(margins: Sequence[tuple[str, str, CaseValue, CaseValue]]) -> list[str]:
    """`MARGIN_STEPS` for ``margins`` ((grader, margin, its `CaseValue` on a candidate's side, on
    the baseline's)): the verdicts' pairs and the quality table read per-case values alike."""
    mm = ", ".join(f"({i}, {literal(g)}, {literal(m)}, {literal(mine.first)})" for i, (g, m, mine, _) in enumerate(margins))
    values = " ".join(f"when {i} then case when g.b then {value_sql(theirs)} else {value_sql(mine)} end"
                      for i, (_, _, mine, theirs) in enumerate(margins))
    suite = _SUITE.replace("s.case_id", "g.case_id")
    suites = " ".join(f"when {i} then {suite}" for i, (_, _, mine, _) in enumerate(margins) if mine.by_suite)
    return [MARGIN_STEPS[0].format(margins=mm),
            MARGIN_STEPS[1].format(values=values, suites=suites or "when -1 then null"), *MARGIN_STEPS[2:]]


# the quality table's graded rows: each variant's first level, the baseline's noise-floor passes
# out (`analysis._FIRST_LEVEL`), with the newest grades of the graders read
_SLICE_GRADED = """create temp table sg as {first_level}
select 0 as k, coalesce(s.variant = $baseline, false) as b, s.variant, s.case_id, coalesce(s.repeat, 0) as repeat,
       s.seq, s.id, s.case_complexity, g.grader, g.value, g.passed, g.detail_json
from sel s join l.grades g on g.request_id = s.id where {newest}"""


# Each grader's failures over a run: its newest grade of a request (per grader version) an error;
# counted, with its first (by grade id) error and case, and how many distinct errors; and the
# requests a grader is handed (`grading.graded_requests`: successful, measured, no trace prompt)
_GRADE_FAILURES = """
with e as (select id, request_id, grader, grader_version, error_class, error from l.grades
           where run_id = $run and error_class is not null),
last as (select request_id, grader, grader_version, max(id) as id from l.grades
         where run_id = $run and request_id in (select request_id from e) group by all),
f as (select e.*, r.case_id, r.variant from e semi join last using (request_id, grader, grader_version, id)
      join l.requests r on r.id = e.request_id)
select grader, count(*), count(distinct (error_class, error)),
       arg_min((error_class, error, case_id, variant), id)  -- a row: arg_min of a column passes over its nulls
from f group by grader order by min(id)"""
_GRADED = """select count(*) from l.measured r join l.runs u on u.id = r.run_id
join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
where r.run_id = $run and r.ok and c.task is distinct from 'trace'"""


# The pairs a reviewer can be shown: each candidate's cases at its first level that the baseline
# also sent at its first (`reporting.reviews`)
_REVIEWABLE = """
with m as (select r.variant, r.case_id, r.load_level from l.measured r join l.runs u on u.id = r.run_id
           join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash where r.run_id = $run),
firsts as (select variant, min(load_level) as first from m group by variant),
fc as (select distinct m.variant, m.case_id from m join firsts f on f.variant = m.variant and f.first = m.load_level)
select count(*) from fc c join fc b on b.case_id = c.case_id where b.variant = $baseline and c.variant <> $baseline"""


class CaseReads:
    """Per-case values of the graders' margins, paired where the grades are."""

    query: Any  # `AnalysisReads.query`
    queries: Any  # `AnalysisReads.queries`
    session: Any  # `AnalysisReads.session`

    def slice_case_values(self, run_id: str, baseline: str | None, repeats: int,
                          margins: Sequence[tuple[str, str, CaseValue, CaseValue]]
                          ) -> tuple[dict[tuple[str, str], dict[str, float]], dict[str, str | None]]:
        """The quality table's per-case values of graders that declare their summary through them
        (`Aggregate.summary_from_cases`): over each variant's first level (the baseline's
        noise-floor passes out), (variant, margin) -> case -> its value of ``margins`` ((grader,
        margin, its `CaseValue` on a candidate's side, on the baseline's)); and each graded case's
        complexity, which puts it in its slice."""
        if not margins:
            return {}, {}
        graders = sorted({g for g, *_ in margins})
        steps = [_SLICE_GRADED.format(first_level=_first_level_sql(), newest=newest_grades(graders)),
                 "select distinct case_id, case_complexity from sg", *margin_steps(margins)]
        got = self.queries(steps, {"run": run_id, "baseline": baseline, "repeats": repeats})
        values: dict[tuple[str, str], dict[str, float]] = {}
        for _, v, m, c, x in got[-1][1]:
            values.setdefault((v, m), {})[c] = float(x)
        return values, {c: cx for c, cx in got[1][1]}

    def load_quality(self, run_id: str, reference: str, margins: Sequence[tuple[str, str, CaseValue, CaseValue]]
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, list[tuple[str, tuple[list[float], list[int]]]]]]:
        """Quality under load from the ledger, the run's successful requests read once (a `session`):
        first, variant -> its entry's outline: the highest level (``top``) and its `load_drift`
        grades: how many (``n``), byte-identical (``same``), the sum and count of their drift
        (``drift_sum`` by `fsum`, ``drift_n``), only the variants with both sides; then variant ->
        (margin, its differences loaded minus unloaded over the case#repeat keys both sides have,
        as (distinct values ascending, how often each came)) for each margin with a pair, in
        ``margins``' order (a `by_suite` margin's suites after it, in the order the loaded side
        first shows them). ``margins``: (grader, margin, its `CaseValue` on the loaded side, on
        the unloaded side)."""
        params = {"run": run_id, "reference": reference}
        with self.session():
            _, (_, rows) = self.queries([_OK, _ENTRIES], params)
            entries = {v: {"top": int(top), "n": n, "same": same, "drift_sum": total, "drift_n": counted}
                       for v, top, n, same, total, counted in rows}
            if not entries or not margins:
                return entries, {}
            mm = ", ".join(f"({i}, {literal(grader)}, {literal(m)}, {literal(mine.first)})"
                           for i, (grader, m, mine, _) in enumerate(margins))
            values = " ".join(f"when {i} then case when s.loaded then {value_sql(mine)} else {value_sql(theirs)} end"
                              for i, (_, _, mine, theirs) in enumerate(margins))
            suites = " ".join(f"when {i} then {_SUITE}" for i, (_, _, mine, _) in enumerate(margins) if mine.by_suite)
            fill = {"margins": mm, "values": values, "suites": suites or "when -1 then null"}
            *_, (_, rows) = self.queries([x.format(**fill) for x in _PAIR_STEPS], params)  # `ok` is made
        out: dict[str, list[tuple[str, tuple[list[float], list[int]]]]] = {}
        for v, m, values, counts, *_ in rows:
            out.setdefault(v, []).append((m, (values, counts)))
        return entries, out

    def flip_counts(self, run_id: str, baseline: str, graders: Sequence[str], by: Sequence[str] = (),
                    repeats: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The pass/fail changes of each candidate against the baseline per case at each variant's
        first level, per value(s) of ``by`` (slice keys as `distributions` takes them), grader and
        rule (None: the grader's own pass), where they share a case: (``group``, ``variant``,
        ``grader``, ``rule``, ``cases``, ``gains``, ``losses``); and the baseline against its first
        noise-floor pass: (``group``, ``grader``, ``rule``, ``cases``, ``flips``). ``repeats``: the
        run's, when the baseline's noise-floor passes are no rows here (then it has no floor)."""
        if not graders:
            return [], []
        gk = [f"by{i}" for i in range(len(by))] or ["grp"]
        keys = ", ".join(_key_sql(k, i) for i, k in enumerate(by)) if by else "0 as grp"
        fill = {"case_fields": ", ".join(f"c.{f} as case_{f}" for f in _ATTR_FIELDS), "keys": keys, "gk": ", ".join(gk),
                "s_gk": ", ".join(f"s.{k}" for k in gk), "graders": ", ".join(literal(g) for g in graders),
                "truthy": _TRUTHY, "same_o": _same("o", "b", gk), "v_gk": ", ".join(f"v.{k}" for k in gk),
                "same_vf": _same("v", "f", gk), "c_gk": ", ".join(f"c.{k}" for k in gk), "same_cb": _same("c", "b", gk),
                "b_gk": ", ".join(f"b.{k}" for k in gk), "same_bf": _same("b", "f", gk)}
        *_, (_, rows) = self.queries([step.format(**fill) for step in _FLIP_STEPS], {
            "run": run_id, "baseline": baseline, "repeats": 2**62 if repeats is None else repeats})
        flips, floors = [], []
        n = len(gk)
        for r in rows:
            group = tuple(_value(k, x) for k, x in zip(by, r[:n], strict=True)) if by else ()
            variant, grader, rule, cases, gains, losses, fn, ff = r[n:]
            if variant is None:
                floors.append({"group": group, "grader": grader, "rule": rule, "cases": fn, "flips": ff})
            else:
                flips.append({"group": group, "variant": variant, "grader": grader, "rule": rule, "cases": cases,
                              "gains": gains, "losses": losses})
        return flips, floors

    def load_side_grades(self, run_id: str, reference: str, grader: str
                         ) -> Iterator[tuple[str, bool, list[dict[str, Any]]]]:
        """(variant, loaded, its newest grades by ``grader``) of each side, as `Ledger.latest_grades`
        gives them with ``case_id`` the request's case#repeat, in send order: what a grader whose
        `margin_values` is not declared is handed."""
        _, (_, rows) = self.queries([_OK, _GRADES], {"run": run_id, "reference": reference, "grader": grader})
        side: tuple[str, bool] | None = None
        grades: list[dict[str, Any]] = []
        for v, loaded, rid, name, version, value, passed, expl, detail, key in rows:
            if side is not None and side != (v, bool(loaded)):
                yield *side, grades
                grades = []
            side = (v, bool(loaded))
            grades.append({"request_id": rid, "grader": name, "grader_version": version, "value": value,
                           "passed": passed, "explanation": expl, "detail": json.loads(detail or "{}"),
                           "case_id": key})
        if side is not None:
            yield *side, grades

    def grade_failure_counts(self, run_id: str) -> tuple[list[dict[str, Any]], int]:
        """(per grader whose newest grade of some request is an error, in the order the first came:
        ``grader``, ``n`` requests, ``kinds`` distinct errors, the first's ``error_class``, ``error``,
        ``case_id`` and ``variant``; the requests the graders are handed), computed in the ledger."""
        _, rows = self.query(_GRADE_FAILURES, {"run": run_id})
        if not rows:
            return [], 0
        _, ((graded,),) = self.query(_GRADED, {"run": run_id})
        keys = ("grader", "n", "kinds", "error_class", "error", "case_id", "variant")
        return [dict(zip(keys, (g, n, kinds, *first), strict=True)) for g, n, kinds, first in rows], int(graded)

    def reviewable_pairs(self, run_id: str, baseline: str) -> int:
        """How many (candidate, case) pairs a reviewer can be shown: the candidate's cases at its
        first level that the baseline sent at its first too."""
        _, ((n,),) = self.query(_REVIEWABLE, {"run": run_id, "baseline": baseline})
        return int(n)
