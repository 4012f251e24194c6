"""The HTML report's chart series as ledger queries (issue 48, item 1): what each chart draws,
computed by DuckDB over the run's successful measured rows (`duck.Duck`), so Python holds a chart's
points, never the run's rows. A mixin of `Ledger` (`AnalysisReads.queries`).

Every chart stays exact: a CDF is drawn through the sorted values (all of them up to ``most``,
else those at ``most`` + 1 evenly spaced ranks, as `round` picks them, and the largest), a box
through its exact percentiles, a scatter through its points in the rows' order (``most`` in all at
most), else as bands: per variant and bin of x the 10th, 50th and 90th percentile of y, the bins
being x's own values where it has at most ``bins`` of them (a level, 1-5), else ``bins`` equal
widths over its range. The rows' order is by seq (none first), then id, as the report reads them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .duck import PerGroup, literal

COMPLEXITIES = ("short", "medium", "long")
BOX_PCTS = (10, 25, 50, 75, 90)
BAND_PCTS = (10, 50, 90)

# the run's successful measured rows, of the variants drawn
_OK = """create temp view ok as
select r.variant, r.seq, r.id, coalesce(nullif(r.level, ''), 'main') as label, c.complexity, r.ttft_ms, r.e2e_ms,
       r.prompt_tokens{fields}
from l.measured r join l.runs u on u.id = r.run_id join l.cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
where r.run_id = $run and r.ok"""
_ORDER = "seq nulls first, id"
# the spikes circled, any variant's (a semi join: a list searched per row took minutes at 10 M rows)
_MARKED = ("select prompt_tokens, ttft_ms from ok semi join (select unnest($spiked::bigint[]) as id) s using (id) "
           f"where coalesce(prompt_tokens, 0) <> 0 order by {_ORDER}")


@dataclass
class Bands:
    """A scatter too large to draw: per series its bins' (x, p10, p50, p90), x's range and how many
    points; ``values``: each bin one of x's values (else ``bins`` equal widths)."""

    n: int
    lo: float
    hi: float
    values: bool
    rows: dict[str, list[tuple[float, float, float, float]]]


@dataclass
class Box:
    """One box: its percentiles (`BOX_PCTS`; None: no value), its finite range and its values in the
    rows' order where the chart draws them."""

    q: dict[int, float] | None
    lo: float | None
    hi: float | None
    points: list[float] = field(default_factory=list)


@dataclass
class ChartSeries:
    """What the charts draw (`ChartReads.chart_series`)."""

    n: dict[tuple[str, Any], int]  # successful requests per (variant, complexity)
    cdf: dict[tuple[str, str], tuple[int, list[tuple[int, float]]]]  # TTFT: (values, [(rank, value)])
    boxes: dict[str, Box]  # E2E per "variant/s|m|l", or per variant where no case has that complexity
    box_values: int  # E2E values in all the boxes
    by_complexity: bool
    tok: dict[str, list[tuple[float, float]]] | Bands  # (prompt tokens, TTFT) per variant
    marked: list[tuple[float, float]]  # the spikes' (prompt tokens, TTFT), in the rows' order
    p99: dict[tuple[str, str], float]  # TTFT p99 per (variant, level label): a sweep's
    scatter: dict[str, dict[str, list[tuple[float, float]]] | Bands]  # a grader's (x, value) per variant
    kl: dict[str, list[tuple[float, float]]]  # divergence: mean KL per answer token per series


class ChartReads:
    """The charts' queries."""

    _db: Any
    queries: Any  # `AnalysisReads.queries`

    def chart_series(self, run_id: str, variants: list[str], spiked: list[int], scatter: dict[str, str],
                     sweep: bool, most: int, bins: int, min_cases: int) -> ChartSeries:
        """The charts of ``variants``' successful rows; ``spiked``: the requests circled (any
        variant's); ``scatter``: grader -> the row or case field its value is drawn against;
        ``sweep``: TTFT p99 per level; ``min_cases``: a KL position is drawn where that many answers
        reach it."""
        fields = self._scatter_fields(scatter)
        alias = {g: f"x{i}" for i, g in enumerate(fields)}
        p = {"run": run_id}
        mine = (f"create temp view mine as select * from ok where variant in "
                f"({', '.join(map(literal, variants)) or 'null'})")
        steps = [_OK.format(fields="".join(f", {sql} as {alias[g]}" for g, sql in fields.items())), mine]
        counts = self.queries([*steps, "select variant, complexity, count(*), count(e2e_ms) from mine group by all"],
                              p)[-1][1]
        n = {(v, cx): int(k) for v, cx, k, _ in counts}
        by_cx = any(cx in COMPLEXITIES for _, cx in n)
        box_values = sum(int(e) for _, cx, _, e in counts if cx in COMPLEXITIES or not by_cx)
        got = self.queries([*steps, _cdf(most), *_boxes(by_cx, box_values <= most),
                            PerGroup(f"select variant, label, quantile_cont(ttft_ms, 0.99) from mine where ttft_ms is not "
                                     f"null and {literal(sweep)} and {{batch}} group by all", "mine", ("variant", "label")),
                            _MARKED, _KL.format(least=int(min_cases))],
                           {**p, "spiked": [int(i) for i in spiked]})[len(steps):]
        cdf_rows, box_rows, point_rows, p99_rows, marked, kl_rows = got if box_values <= most else \
            (got[0], got[1], (None, []), *got[2:])
        cdf: dict[tuple[str, str], tuple[int, list[tuple[int, float]]]] = {}
        for v, cx, k, i, x in cdf_rows[1]:
            cdf.setdefault((v, cx), (int(k), []))[1].append((int(i), x))
        tok = self._xy(steps, p, "prompt_tokens", "ttft_ms", "coalesce(prompt_tokens, 0) <> 0", "", variants, most,
                       bins)
        graded = {g: self._xy(steps, {**p, "grader": g}, alias[g], "g.value", "true",
                              " join l.grade_latest g on g.request_id = m.id and g.grader = $grader", variants, most,
                              bins) for g in fields}
        return ChartSeries(n=n, cdf=cdf, boxes=_box_of(box_rows[1], point_rows[1], by_cx), box_values=box_values,
                           by_complexity=by_cx, tok=tok, marked=[(x, y) for x, y in marked[1]],
                           p99={(v, lab): q for v, lab, q in p99_rows[1]}, scatter=graded,
                           kl=_kl_of(kl_rows[1]))

    def _scatter_fields(self, scatter: dict[str, str]) -> dict[str, str]:
        """Grader -> the SQL of its x: a request's column, else its case's (a field neither has: no points)."""
        req, case = self._db["requests"].columns_dict, self._db["cases"].columns_dict
        return {g: f"r.{f}" if f in req else f"c.{f}" for g, f in scatter.items() if f in req or f in case}

    def _xy(self, steps: list[str], p: dict[str, Any], x: str, y: str, where: str, join: str, variants: list[str],
            most: int, bins: int) -> dict[str, list[tuple[float, float]]] | Bands:
        """Points (x, y) of each variant in the rows' order, or their `Bands` past ``most`` in all."""
        pts = (f"create temp view pts as select m.variant, m.seq, m.id, m.{x} as x, {y} as y from mine m{join} "
               f"where m.{x} is not null and {y} is not null and {where}")
        total, lo, hi, values = self.queries([*steps, pts, "select count(*), min(x), max(x), count(distinct x) "
                                                           "from pts"], p)[-1][1][0]
        if total <= most:
            _, rows = self.queries([*steps, pts, f"select variant, x, y from pts order by {_ORDER}"], p)[-1]
            out: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
            for v, px, py in rows:
                out[v].append((px, py))
            return out
        by_value = values <= bins
        width = (hi - lo) / bins or 1.0
        b = "x" if by_value else f"least({bins - 1}, trunc((x - {literal(lo)}) / {literal(float(width))}))"
        qs = ", ".join(str(q / 100) for q in BAND_PCTS)
        _, rows = self.queries([*steps, pts, f"create temp table bt as select variant, {b} as b, y from pts",
                                PerGroup(f"select variant, b, quantile_cont(y, [{qs}]) from bt where {{batch}} "
                                         "group by all order by variant, b", "bt", ("variant", "b"))], p)[-1]
        bands: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in variants}
        for v, at, (q10, q50, q90) in rows:
            bands[v].append((at if by_value else lo + (at + 0.5) * width, q10, q50, q90))
        return Bands(n=int(total), lo=lo, hi=hi, values=by_value, rows=bands)


def _cdf(most: int) -> str:
    """Each (variant, shipped complexity)'s TTFTs ranked (0-based): every one up to ``most``, else
    those at ``most`` + 1 evenly spaced ranks (rounded half to even, as Python's `round`) and the last."""
    return f"""
with w as (select variant, complexity, ttft_ms as x, row_number() over (partition by variant, complexity
                                                                   order by ttft_ms) - 1 as i,
                  count(*) over (partition by variant, complexity) as k
           from mine where ttft_ms is not null and complexity in ({', '.join(map(literal, COMPLEXITIES))})),
     big as (select variant, complexity, count(*) as k from mine where ttft_ms is not null
             and complexity in ({', '.join(map(literal, COMPLEXITIES))}) group by all having count(*) > {most}),
     idx as (select distinct variant, complexity, round_even(j * (k - 1) / {most}, 0)::bigint as i
             from big cross join range(0, {most + 1}) t(j))
select w.variant, w.complexity, w.k, w.i, w.x from w left join idx using (variant, complexity, i)
where w.k <= {most} or w.i = w.k - 1 or idx.i is not null order by w.variant, w.complexity, w.i"""


def _boxes(by_cx: bool, points: bool) -> list[str | PerGroup]:
    """E2E percentiles per box, a batch of boxes at a time (`PerGroup`), and, while the chart draws
    them, the values in the rows' order."""
    cx = "complexity" if by_cx else "null"
    where = f"e2e_ms is not null{' and complexity in (' + ', '.join(map(literal, COMPLEXITIES)) + ')' if by_cx else ''}"
    qs = ", ".join(str(q / 100) for q in BOX_PCTS)
    out: list[str | PerGroup] = [PerGroup(
        f"select variant, {cx} as complexity, quantile_cont(e2e_ms, [{qs}]), min(e2e_ms) filter (where isfinite(e2e_ms)), "
        f"max(e2e_ms) filter (where isfinite(e2e_ms)) from mine where {where} and {{batch}} group by all", "mine",
        ("variant", "complexity") if by_cx else ("variant",))]
    if points:
        out.append(f"select variant, complexity, e2e_ms from mine where {where} order by {_ORDER}")
    return out


def _box_of(stats: list[tuple[Any, ...]], values: list[tuple[Any, ...]], by_cx: bool) -> dict[str, Box]:
    """The boxes by name ("variant/s", or the variant), values grouped as the chart drew them: a
    variant's without the shipped complexity in the order its complexities first come, each in the
    rows' order."""
    name = (lambda v, cx: f"{v}/{cx[0]}") if by_cx else (lambda v, cx: v)
    out = {name(v, cx): Box(dict(zip(BOX_PCTS, q, strict=True)), lo, hi) for v, cx, q, lo, hi in stats}
    grouped: dict[str, dict[Any, list[float]]] = defaultdict(dict)
    for v, cx, x in values:
        grouped[name(v, cx)].setdefault(cx, []).append(x)
    for key, parts in grouped.items():
        out[key].points = [x for xs in parts.values() for x in xs]
    return out


# the divergence grader's KL per answer token: per series (the variant, or its batching floor) and
# token, the sum and count over the answers reaching it; each series' first row (its order)
_KL = """
with d as (select case when json_extract_string(g.detail_json, '$.kind') = 'floor' then m.variant || ' (floor)'
                       else m.variant end as name, m.seq, m.id,
                  json_extract(g.detail_json, '$.kl_tokens')::double[] as kl
           from ok m join l.grade_latest g on g.request_id = m.id and g.grader = 'divergence'
           where json_valid(g.detail_json) and json_extract_string(g.detail_json, '$.status') = 'ok'),
     f as (select * from d where len(kl) > 0),
     firsts as (select name, min([(seq is not null)::bigint, coalesce(seq, 0), id]) as o from f group by name),
     t as (select name, generate_subscripts(kl, 1) - 1 as pos, unnest(kl) as x from f)
select t.name, any_value(firsts.o), t.pos, sum(t.x), count(*) from t join firsts using (name) group by all
having count(*) >= {least} order by 2, 1, 3"""


def _kl_of(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for name, _, pos, s, k in rows:
        out.setdefault(name, []).append((float(pos), s / k))
    return out
