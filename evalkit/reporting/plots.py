"""The HTML report's charts, one colour per variant across all of them (svgplot.color_map)."""

from __future__ import annotations

from array import array
from collections import defaultdict
from itertools import pairwise
from typing import Any

from ..grading.registry import available
from ..ledger import Ledger
from ..stats import percentile
from . import svgplot
from .load_curve import curve_plots
from .plot_series import Along, Packed, Pairs, jittered
from .rowseq import succeeded
from .selection import by_variant
from .token_plots import divergence_plots, kl_add, kl_series, row_order

# the graders whose pass/fail makes the quality score of the quality-vs-speed/price charts
QUALITY_GRADERS = ("schema", "persona", "formality")
STRETCH = 50_000  # rows of the run the charts read at a time


def frontier(points: dict[str, tuple[float, float]], higher_x: bool) -> set[str]:
    """The Pareto set: points no other beats on both quality (y, higher) and x (higher or lower)."""
    out = set()
    for k, (x, y) in points.items():
        beaten = any((y2 >= y and (x2 >= x if higher_x else x2 <= x)) and (y2 > y or x2 != x)
                     for k2, (x2, y2) in points.items() if k2 != k)
        if not beaten:
            out.add(k)
    return out


def quality_points(scores: list[dict[str, Any]], cost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and load level with a quality score (`capacity.load_levels`' second list: % of
    its outputs passing schema, persona and formality, output tokens/s per user) its $ per million
    output tokens; which are on the frontier (`mark_frontier`)."""
    usd = {(c["variant"], c["level"]): c["usd_per_m_output_tokens"] for c in cost}
    return mark_frontier([{**e, "usd_per_m_output_tokens": usd.get((e["variant"], e["level"]))} for e in scores])


def mark_frontier(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which points are on the speed and the price frontier, over every variant's points."""
    key = {f"{e['variant']} c={e['concurrency']}": e for e in out}
    fast = frontier({k: (e["tps_per_user"], e["quality_pct"]) for k, e in key.items() if e["tps_per_user"]}, True)
    cheap = frontier({k: (e["usd_per_m_output_tokens"], e["quality_pct"]) for k, e in key.items()
                      if e["usd_per_m_output_tokens"]}, False)
    for k, e in key.items():
        e["pareto_speed"], e["pareto_price"] = k in fast, k in cheap
    return out


class PlotData:
    """What the charts draw from the rows, gathered a stretch of rows at a time and held compactly
    (a few bytes a point, `plot_series`): the HTML report of any run holds one stretch of rows,
    not the run's (issue 37). Fed the rows in their order, variant by variant in ``variants``'
    order, the charts are the same as from the whole run's rows."""

    def __init__(self, variants: list[str], f: dict[str, Any]) -> None:
        self.variants = variants
        self.spiked = {s["request_id"] for s in f["spikes"]}
        self.levels = f["load_levels"]
        self.sweep = len({lv["concurrency"] for lv in self.levels}) > 1
        self.n: dict[tuple[str, str], int] = defaultdict(int)  # ok rows per variant x complexity
        self.ttft: dict[tuple[str, str], array[float]] = defaultdict(lambda: array("d"))
        self.ttft_pt: dict[tuple[str, str], array[int]] = defaultdict(lambda: array("i"))  # beside each TTFT
        self.e2e: dict[tuple[str, str], array[float]] = defaultdict(lambda: array("d"))
        # (prompt tokens, TTFT) per variant in the rows' order, while few enough to be drawn as
        # points; past that the chart is bands, drawn from `ttft_pt` beside `ttft` (`Along`)
        self.tok: dict[str, tuple[array[int], array[float]]] | None = {}
        self.marked: list[tuple[tuple[Any, ...], tuple[float, float]]] = []  # (row order, point)
        self.p99: dict[tuple[str, str], float] = {}
        self.at_level: dict[tuple[str, str], array[float]] = {}  # the variant being read: TTFTs per level
        self.scatter = {name: cls.aggregate.scatter for name, cls in available().items() if cls.aggregate.scatter}
        self.raw: dict[str, dict[str, tuple[Packed, Packed]]] = {name: {} for name in self.scatter}
        self.fed: list[str] = []  # the variants in the order read: the jitter streams' order
        self.kl: dict[str, dict[int, list[float]]] = {}  # name -> position -> [sum, count]
        self.kl_first: dict[str, tuple[Any, ...]] = {}  # name -> its first row's order

    # the request columns `_variant` reads (case fields and grades come with every row)
    READS = frozenset({"variant", "level", "error_class", "ttft_ms", "e2e_ms", "prompt_tokens", "id", "seq"})

    def reads(self) -> tuple[set[str], set[str]]:
        """(request columns, graders) the charts read: a row read with these alone draws the same."""
        return {*self.READS, *(fld for fld, _, _ in self.scatter.values())}, {*self.scatter, "divergence"}

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Rows in their order: a stretch of one variant's, or the run's (each variant's part is
        taken in ``variants``' order)."""
        groups = by_variant(succeeded(rows))  # rows read from the ledger: indices, not a view a row
        for v in [v for v in self.variants if v in groups] + [v for v in groups if v not in self.variants]:
            self._variant(v, groups[v])

    def _variant(self, v: str, ok: list[dict[str, Any]]) -> None:
        if v in self.variants:
            if not self.fed or self.fed[-1] != v:
                if v in self.fed:  # its levels' p99 and its jitter stream were taken as one stretch
                    raise ValueError(f"the charts were fed {v!r} again after {self.fed[-1]!r}: a variant's rows "
                                     "come together")
                self._levels_done()
                self.fed.append(v)
            self._timings(v, ok)
            for name, (fld, _, _) in self.scatter.items():
                pts = [(r[fld], r["grades"][name]["value"]) for r in ok
                       if name in r["grades"] and r.get(fld) is not None and r["grades"][name]["value"] is not None]
                xs, ys = self.raw[name].setdefault(v, (Packed(), Packed()))
                xs.extend([x for x, _ in pts])
                ys.extend([y for _, y in pts])
        for r in ok:
            if r["id"] in self.spiked and r["prompt_tokens"]:
                self.marked.append((row_order(r), (r["prompt_tokens"], r["ttft_ms"])))
            kl_add(self.kl, self.kl_first, r)

    def _timings(self, v: str, ok: list[dict[str, Any]]) -> None:
        for r in ok:
            key = (v, r["complexity"])
            self.n[key] += 1
            t = r["ttft_ms"]
            if t is not None:
                self.ttft[key].append(t)
                self.ttft_pt[key].append(r["prompt_tokens"] or 0)  # prompt tokens: 32 bits hold any prompt
            if r["e2e_ms"] is not None:
                self.e2e[key].append(r["e2e_ms"])
            if self.sweep:
                lk = (v, r["level"] or "main")
                at = self.at_level.get(lk)
                if at is None:
                    at = self.at_level[lk] = array("d")
                if t is not None:
                    at.append(t)
        if self.tok is not None:
            xs, ys = self.tok.setdefault(v, (array("i"), array("d")))
            for r in ok:
                if r["prompt_tokens"] and r["ttft_ms"] is not None:
                    xs.append(r["prompt_tokens"])
                    ys.append(r["ttft_ms"])
            if sum(len(xs) for xs, _ in self.tok.values()) > svgplot.MAX_POINTS:
                self.tok = None  # too many to draw as points: bands, whose points need no order

    def _levels_done(self) -> None:
        """The variant read last is done: its TTFT p99 per load level, and its TTFTs let go."""
        if self.fed and self.sweep:
            v = self.fed[-1]
            for lv in self.levels:
                if lv["variant"] == v and (v, lv["level"]) in self.at_level:
                    self.p99[(v, lv["level"])] = percentile(self.at_level[(v, lv["level"])], 99) or 0.0
                elif lv["variant"] == v:
                    self.p99.setdefault((v, lv["level"]), 0.0)
        self.at_level = {}

    def finish(self) -> PlotData:
        self._levels_done()
        return self

    def tok_series(self) -> dict[str, Any]:
        """(prompt tokens, TTFT) per variant: in the rows' order, or along the arrays for bands."""
        if self.tok is not None:
            return {v: Pairs(*self.tok.get(v, ((), ()))) for v in self.variants}
        return {v: Along([(self.ttft_pt[k], self.ttft[k]) for k in self.ttft if k[0] == v]) for v in self.variants}

    def points(self, name: str) -> dict[str, Any]:
        """A scatter grader's points per variant, jittered as they were read (`Jittered`)."""
        series = jittered(self.raw[name], self.fed)
        return {v: series.get(v) or Pairs((), ()) for v in self.variants}


def plots(ledger: Ledger, run_id: str, f: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str]]:
    """The charts: each variant's rows read from the ledger in turn, a stretch of rows at a time,
    and let go (`PlotData`)."""
    from .rows import give_back, request_rows

    present = list(ledger.slice_levels(run_id))
    variants = list(dict.fromkeys(v["name"] for v in report["variants"])) or present
    data = PlotData(variants, f)
    outline = ledger.level_outline(run_id)
    stretches = ledger.seq_ranges(run_id, STRETCH)
    only, graders = data.reads()
    for v in [v for v in variants if v in present] + [v for v in present if v not in variants]:
        for level in _in_row_order(outline, v):  # one level's rows at a time, in the rows' order
            lo, hi = _span(outline, v, level)
            for a, b in stretches:  # a stretch of the run at a time: memory bounded at any size
                if a <= hi and b >= lo:
                    data.add(request_rows(ledger, run_id, v, level, seqs=(max(a, lo), min(b, hi)), only=only,
                                          graders=graders))
                    give_back()
    return draw(ledger, run_id, data.finish(), f, report)


def _span(outline: dict[str, Any], variant: str, level: int | None) -> tuple[int, int]:
    """The first and last seq of a variant's rows at a load level (``None``: at every level)."""
    spans = [s for (v, lv), s in outline["seqs"].items() if v == variant and level in (None, lv)]
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)


def _in_row_order(outline: dict[str, Any], variant: str) -> list[int | None]:
    """A variant's load levels in the order its rows show them, when each level's rows come
    one after another (a sweep) and no level label spans two concurrencies; else [None]: the
    variant's rows at once (read a level at a time, they would be fed out of order)."""
    spans = sorted((lo, hi, lv) for (v, lv), (lo, hi) in outline["seqs"].items() if v == variant)
    split = any(len(ls) > 1 for (v, _), ls in outline["slices"].items() if v == variant)
    if split or any(a[1] >= b[0] for a, b in pairwise(spans)):
        return [None]
    return [lv for _, _, lv in spans]


def draw(ledger: Ledger, run_id: str, data: PlotData, f: dict[str, Any], report: dict[str, Any]
         ) -> list[tuple[str, str]]:
    variants = data.variants
    cols = svgplot.color_map(variants)
    out: list[tuple[str, str]] = []
    for cx in ("short", "medium", "long"):
        samples = {v: data.ttft[(v, cx)] for v in variants}
        if any(data.n[(v, cx)] for v in variants):
            out.append((f"TTFT CDF, {cx}", svgplot.cdf(f"TTFT CDF — {cx} prompts", "TTFT (ms)", samples, cols)))
    by_cx = any(data.n[(v, cx)] for v in variants for cx in ("short", "medium", "long"))
    if by_cx:
        groups = {f"{v}/{cx[0]}": data.e2e[(v, cx)] for v in variants for cx in ("short", "medium", "long")}
        owner = {f"{v}/{cx[0]}": v for v in variants for cx in ("short", "medium", "long")}
    else:  # a workload without the shipped complexity: one box a variant, over all its cases
        groups = {v: array("d", [x for k, xs in data.e2e.items() if k[0] == v for x in xs]) for v in variants}
        owner = {v: v for v in variants}
    out.append(("E2E distributions", svgplot.boxes("E2E by variant / complexity (s, m, l)" if by_cx else
                                                   "E2E by variant (the cases have no complexity)", "E2E (ms)", groups,
                                                   cols, owner)))
    series = data.tok_series()
    marked = [p for _, p in sorted(data.marked, key=lambda m: m[0])]  # the rows' order
    out.append(("TTFT vs prompt tokens", svgplot.scatter("TTFT vs prompt tokens (spikes circled)", "prompt tokens",
                                                         "TTFT (ms)", series, marked, cols)))
    for metric, label in (("kv_cache_usage_perc", "KV-cache use (%)"), ("num_requests_waiting", "requests waiting"),
                          ("num_requests_running", "requests running")):
        ts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for x in ledger.server_series(run_id, metric):
            ts[x["variant"]].append((x["mono_ms"] / 1000.0, x["value"] * (100 if "perc" in metric else 1)))
        if ts:
            out.append((f"{label} timeline", svgplot.lines(f"{label} over the run", "seconds since the variant's start",
                                                           label, dict(ts), step=True, colors=cols)))
    out += capacity_plots(data, f, report, variants, cols)
    out += curve_plots(f["load_levels"], variants, cols)  # the knee and first saturated level marked
    out += quality_plots(data, f, report, variants, cols)
    out += divergence_plots(kl_series(data.kl, data.kl_first), variants, cols)  # KL along the answer
    return out


def capacity_plots(data: PlotData, f: dict[str, Any], report: dict[str, Any], variants: list[str],
                   cols: dict[str, str]) -> list[tuple[str, str]]:
    """A sweep: goodput and TTFT p99 against concurrency, every variant on one chart, each
    variant's predicted capacity (requests its KV cache holds at once) marked."""
    levels = f["load_levels"]
    if len({lv["concurrency"] for lv in levels}) <= 1:
        return []
    out = []
    pred = [(c["max_concurrency_predicted"], f"{c['variant']} fits {c['max_concurrency_predicted']}", c["variant"])
            for c in f["capacity"] if c.get("max_concurrency_predicted")]
    if any(lv["goodput_pct"] is not None for lv in levels):
        gp = {v: [(lv["concurrency"], lv["goodput_pct"]) for lv in levels if lv["variant"] == v] for v in variants}
        out.append(("Goodput vs concurrency", svgplot.lines(
            "Goodput (requests meeting every SLO) vs concurrency; dotted: predicted capacity", "concurrency",
            "goodput (%)", gp, ylim=(0, 100), colors=cols, vlines=pred)))
    slo = report["slo_ms"]
    p99 = {v: [(lv["concurrency"], data.p99.get((v, lv["level"]), 0.0)) for lv in levels if lv["variant"] == v]
           for v in variants}
    out.append(("TTFT p99 vs concurrency", svgplot.lines(
        "TTFT p99 vs concurrency" + (" (dashed: the TTFT SLO)" if slo.get("ttft") else ""), "concurrency",
        "TTFT p99 (ms)", p99, hlines=[(slo["ttft"], f"SLO {slo['ttft']:,.0f} ms")] if slo.get("ttft") else None,
        colors=cols, vlines=pred)))
    return out


def quality_plots(data: PlotData, f: dict[str, Any], report: dict[str, Any], variants: list[str],
                  cols: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    drift_rows = [r for r in report["rows"] if r["complexity"] == "all" and r["variant"] != report["baseline"]]
    if any(r.get("drift_mean") is not None for r in drift_rows):
        base = next((r for r in report["rows"] if r["variant"] == report["baseline"] and r["complexity"] == "all"), {})
        g = {r["variant"]: r["drift_mean"] for r in drift_rows}
        refs = {r["variant"]: base.get("floor_mean") for r in drift_rows}
        errs = {r["variant"]: (r["floor_mean"] + r["drift_minus_floor_ci95"][0],
                               r["floor_mean"] + r["drift_minus_floor_ci95"][1])
                for r in drift_rows if r.get("drift_minus_floor_ci95") and r.get("floor_mean") is not None}
        out.append(("Drift vs noise floor", svgplot.bars("Drift (1 − cosine) vs the baseline; dashed: noise floor",
                                                         "drift", g, errs, refs, cols)))
    for name, (_, xl, yl) in data.scatter.items():  # each grader that asks: its value against a case field
        pts = data.points(name)  # jittered as they were read
        if any(pts.values()):
            title = f"{name.capitalize()}: {xl} vs {yl} (jittered)"
            out.append((title, svgplot.scatter(title, xl, yl, pts, colors=cols)))
    qc = f.get("quality_vs_cost") or []
    for xkey, flag, xl, title in (("tps_per_user", "pareto_speed", "output tokens/s per user",
                                   "Quality vs speed per user (labelled: the Pareto set)"),
                                  ("usd_per_m_output_tokens", "pareto_price", "$ per million output tokens",
                                   "Quality vs price (labelled: the Pareto set)")):
        pts = {v: [(e[xkey], e["quality_pct"]) for e in qc if e["variant"] == v and e[xkey]] for v in variants}
        if any(pts.values()):
            labels = [(e[xkey], e["quality_pct"], f"{e['variant']} c={e['concurrency']}") for e in qc
                      if e.get(flag) and e[xkey]]
            out.append((title, svgplot.scatter(title, xl, "quality: % passing schema, persona, formality", pts,
                                               colors=cols, labels=labels)))
    return out
