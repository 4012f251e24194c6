"""What a candidate's verdicts test, as ledger queries (issue 48): per case, never per request.
DuckDB reads the baseline's rows at one load level beside one candidate's and reduces them to what
the tests take (`reporting.pairing` says why each rule is there):

- latency: per field and case, each side's sum, count and failed requests of its successful values
  on the repeats both sides sent, and the worst value either side showed (a failed request takes
  it); each case's alternation block (its baseline's first row's, else the candidate's) and whether
  the rows are blocked;
- a grader's declared margins (`CaseValue`): each side's value per case (the mean of its grades, or
  its lowest repeat's, the first sent on a tie), also per suite where declared;
- flips: each side's pass/fail per case of its lowest repeat with one;
- the slices a weighted grade sample stands for: each answered case's slice (`pairing.stratum`)
  and whether both sides answered it.

A mixin of `Ledger` (`AnalysisReads.queries`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..catalogue import CaseValue
from .analysis import _SQL_OF
from .case_reads import MARGIN_STEPS, margin_steps
from .duck import literal, newest_grades

# the pairs: each candidate's level beside the baseline's (k: the pair's index)
_PLAN = "create temp table plan as select * from (values {pairs}) t(k, bv, bl, cv, cl)"

# each pair's rows (a baseline's level in every pair that reads it; b: the baseline's side), with
# each latency field's value (a derived metric by its SQL)
_PAIR = """create temp table pr as
select p.k, s.id, s.seq, s.variant, s.variant = p.bv as b, s.case_id, coalesce(s.repeat, 0) as repeat, s.level,
       s.order_block, s.ok, s.concurrency, s.cx{fields}
from (select r.*, c.complexity as cx from l.measured r join l.runs u on u.id = r.run_id
      join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash where r.run_id = $run) s
join plan p on (s.variant = p.bv and s.load_level = p.bl) or (s.variant = p.cv and s.load_level = p.cl)"""

# the repeats both sides sent (the baseline's noise-floor passes are not cases)
_SHARED = """create temp table px as select x.* from pr x join (
  select k, repeat from pr where b intersect select k, repeat from pr where not b) r using (k, repeat)"""

# each case's block: its baseline's first row's, else its candidate's (a case's first row by
# `arg_min_null`: a hash aggregate over a few hundred groups, where a window sorted every row)
_FIRST = "(not b, seq, id)"
_UNITS = f"""select k, case_id, arg_min_null(level, {_FIRST}), arg_min_null(order_block, {_FIRST})
from px group by k, case_id order by k, case_id"""

_BLOCKED = """select k, coalesce(bool_and(order_block is not null), false)
  and k in (select k from pr group by k, level, order_block having count(distinct case_id) > 1) from pr group by k"""

_LATENCY = """with v as (select k, b, case_id, case when ok then f{i} end as x, not ok as bad from px
                where not ok or f{i} is not null),
w as (select k, {worst}(x) as worst from v group by k),
per as (select k, b, case_id, sum(x) as s, count(x) as n, count(*) filter (where bad) as nf from v group by all)
select a.k, a.case_id, a.s, a.n, a.nf, c.s, c.n, c.nf, w.worst from per a join per c using (k, case_id) join w using (k)
where not a.b and c.b order by a.k, a.case_id"""

# each answered case's slice (`pairing.stratum`, from its baseline's first success, else its
# candidate's) and whether both sides answered it
_STRATA = f"""select k, case_id,
       arg_min_null(coalesce(cast(concurrency as varchar), 'None') || '/' || coalesce(nullif(cx, ''), '-'), {_FIRST}),
       bool_or(b) and bool_or(not b)
from pr where ok group by k, case_id order by k, case_id"""

# the pairs' newest grades by the graders read, read once (`duck.newest_grades`); the hash table is
# built on the pairs' rows, the few columns kept (on the grades, texts and all, it ran past the 128 MB
# pool at 10 M rows and the whole query was run again at 512 MB)
_GRADED = """create temp table sg as
select s.k, s.b, s.variant, s.case_id, s.repeat, s.seq, s.id, g.grader, g.value, g.passed, g.detail_json
from l.grades g join (select k, b, variant, case_id, repeat, seq, id from pr) s on g.request_id = s.id
where {newest}"""

_PASSES = """select k, variant, grader, case_id, arg_min_null(passed, (repeat, seq, id)) <> 0
from sg where grader in ({graders}) and passed is not null
group by k, variant, grader, case_id order by k, variant, grader, case_id"""

# a grader read through its `margin_values`: its grades, as `verdicts.grader_values` gives them
_GRADES = """select s.k, s.variant, g.request_id, g.grader, g.grader_version, g.value, g.passed, g.explanation,
       g.detail_json, s.case_id, s.repeat
from pr s join l.grade_latest g on g.request_id = s.id where g.grader = {grader} order by s.k, s.variant, s.seq, s.id"""


@dataclass
class LatencyCases:
    """One latency field's pairs per case (sorted): each side's sum and count of successful values
    and its failed requests, the worst value either side showed (None: no value at all), and each
    case's block."""

    cases: list[str] = field(default_factory=list)
    cand: list[tuple[float, int, int]] = field(default_factory=list)
    base: list[tuple[float, int, int]] = field(default_factory=list)
    worst: float | None = None
    units: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass
class PairInputs:
    """Everything one candidate's tests against the baseline read, per case."""

    blocked: bool = False
    latency: dict[str, LatencyCases] = field(default_factory=dict)
    values: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (side, margin) -> case -> value
    passes: dict[tuple[str, str], dict[str, bool]] = field(default_factory=dict)  # (side, grader) -> case -> pass
    slice_of: dict[str, str] = field(default_factory=dict)  # answered case -> its slice
    population: dict[str, int] = field(default_factory=dict)  # slice -> cases both sides answered


class VerdictReads:
    """Candidates' and the baseline's per-case values, reduced where the rows are."""

    queries: Any  # `AnalysisReads.queries`

    def pair_inputs(self, run_id: str, pairs: Sequence[tuple[str, int, str, int]],
                    latency: Sequence[tuple[str, bool]] = (),
                    margins: Sequence[tuple[str, str, CaseValue, CaseValue]] = (),
                    flips: Sequence[str] = (), grades: Sequence[str] = ()
                    ) -> list[tuple[PairInputs, dict[tuple[str, str], list[dict[str, Any]]]]]:
        """For each pair of ``pairs`` ((baseline, its load level, candidate, its load level)), in
        one pass over the run: each latency field of ``latency`` ((field, higher is better)), each
        margin of ``margins`` ((grader, margin, its `CaseValue` on the candidate's side, on the
        baseline's)), the passes of each grader of ``flips``; and for each grader of ``grades`` (one
        whose values are not declared) each side's newest grades, as `verdicts.grader_values`
        gives them, in send order: (side, grader) -> grades."""
        if not pairs:
            return []
        fields = "".join(f", {_SQL_OF.get(f, _col(f))} as f{i}" for i, (f, _) in enumerate(latency))
        plan = ", ".join(f"({k}, {literal(b)}, {int(bl)}, {literal(c)}, {int(cl)})" for k, (b, bl, c, cl) in enumerate(pairs))
        steps = [_PLAN.format(pairs=plan), _PAIR.format(fields=fields), _SHARED, _BLOCKED, _UNITS, _STRATA]
        steps += [_LATENCY.format(i=i, worst="min" if hib else "max") for i, (_, hib) in enumerate(latency)]
        graded = sorted({*flips, *(g for g, *_ in margins)})
        if graded:
            steps.append(_GRADED.format(newest=newest_grades(list(graded))))
        if flips:
            steps.append(_PASSES.format(graders=", ".join(literal(g) for g in flips)))
        if margins:
            steps += margin_steps(margins)
        steps += [_GRADES.format(grader=literal(g)) for g in grades]
        got = [rows for _, rows in self.queries(steps, {"run": run_id})]
        out = [(PairInputs(), {}) for _ in pairs]  # type: list[tuple[PairInputs, dict[tuple[str, str], list[dict[str, Any]]]]]
        for k, blocked in got[3]:
            out[k][0].blocked = bool(blocked)
        units = {(k, c): (lv, b) for k, c, lv, b in got[4]}
        for k, c, label, both in got[5]:
            inp = out[k][0]
            inp.slice_of[c] = label
            if both:
                inp.population[label] = inp.population.get(label, 0) + 1
        for i, (f, _) in enumerate(latency):
            for inp, _ in out:
                inp.latency[f] = LatencyCases()
            for k, c, sa, na, fa, sb, nb, fb, worst in got[6 + i]:
                lc = out[k][0].latency[f]
                lc.worst = worst
                lc.cases.append(c)
                lc.cand.append((sa or 0.0, na, fa))
                lc.base.append((sb or 0.0, nb, fb))
                lc.units.append(units[(k, c)])
        rest = got[6 + len(latency) + bool(graded):]
        if flips:
            for k, v, g, c, ok in rest.pop(0):
                out[k][0].passes.setdefault((v, g), {})[c] = bool(ok)
        if margins:
            for k, v, m, c, x in rest[len(MARGIN_STEPS) - 1]:
                out[k][0].values.setdefault((v, m), {})[c] = float(x)
        for g, rows in zip(grades, got[len(got) - len(grades):], strict=True):
            for k, (b, _, c, _) in enumerate(pairs):
                out[k][1][(c, g)], out[k][1][(b, g)] = [], []
            for k, v, rid, name, version, value, passed, expl, detail, case, rep in rows:
                out[k][1][(v, g)].append({
                    "request_id": rid, "grader": name, "grader_version": version, "value": value, "passed": passed,
                    "explanation": expl, "detail": json.loads(detail) if detail else {}, "case_id": case,
                    "repeat": rep})
        return out


def _col(name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"latency field {name!r}: a column name")
    return f'"{name}"'
