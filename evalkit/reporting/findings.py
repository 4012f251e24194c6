"""Findings computed from the ledger: distributions per slice, paired comparisons against the
baseline with bootstrap intervals, spikes and their attribution, capacity, SLO recommendations,
and the study-style summary. Everything here reads rows; nothing is measured again."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from ..catalogue import named
from ..errors import UsageError
from ..grading.base import Aggregate, declared_notes_where, hook
from ..grading.registry import available, use_run
from ..ledger import Ledger
from ..stats import mean, percentile, time_weighted_mean
from . import flips
from .by_attr import by_quality, measured
from .capacity import capacity, capacity_statement, cost, load_levels, usage_of
from .ledger_findings import ledger_findings
from .plots import quality_points
from .report import build_report, quality, table_quality
from .reviews import review_lines, review_summary
from .rows import NotedRows, RunRows, request_rows
from .selection import first_level
from .spike_summary import Spike, Spikes
from .traffic import conversations, prefix_sharing, trace_fidelity, traffic_lines
from .under_load import lines as ul_lines
from .under_load import quality_under_load
from .verdicts import ledger_verdicts, parse_margins, sentences

LATENCY_FIELDS = tuple(m.key for m in named("summary").values())  # the catalogue's per-slice summary rows


def slices(ledger: Ledger, run: Any, baseline: str | None, by: list[str]) -> list[dict[str, Any]]:
    """Distribution of every summary metric per variant x slice (any combination of case fields)
    over each variant's first level, in SQL (`Ledger.distributions`). The graders' columns are
    the report's quality table (by complexity) and `by_quality` (by anything else): paired with the
    baseline's same slice, as a per-pair grader needs."""
    return ledger.distributions(run["id"], baseline, run.repeats, by, list(named("summary").values()))


# --- spikes ---------------------------------------------------------------------------------------


def attribute_spike(r: dict[str, Any], metric: str, first_seq: int | None,
                    medians: tuple[float, float | None]) -> tuple[str, str]:
    """Why was this request slow? queued, cold/long prefill, preemption, or unexplained.
    ``medians``: its slice's median of the metric and of the server's prefill."""
    med, prefill_med = medians
    excess = (r[metric] or 0.0) - med
    if (r["srv_preemptions"] or 0) > 0:
        return "preemption", f"{r['srv_preemptions']:.0f} preemption(s) during the request"
    if r["srv_queue_ms"] is not None and r["srv_queue_ms"] >= 0.5 * excess:
        return "queued", f"server queue {r['srv_queue_ms']:.0f} ms (waiting at start: {r['srv_waiting_start']})"
    if r["srv_prefill_ms"] is not None and prefill_med is not None and r["srv_prefill_ms"] - prefill_med >= 0.5 * excess:
        cold = " (first measured request on this server)" if r["seq"] == first_seq else ""
        return "cold/long prefill", (f"server prefill {r['srv_prefill_ms']:.0f} ms vs slice median "
                                     f"{prefill_med:.0f} ms{cold}")
    if r["seq"] == first_seq:
        return "cold/long prefill", "first measured request on this server"
    running, waiting = r.get("srv_running_start") or 0, r.get("srv_waiting_start") or 0
    if running >= 1 or waiting >= 1:
        return "contention", f"{running:.0f} request(s) running and {waiting:.0f} waiting when it started"
    if r["srv_method"] is None:
        return "unexplained", "no server telemetry for this request"
    return "unexplained", "queue, prefill and preemptions were all normal"


def spikes(ledger: Ledger, run_id: str, metric: str = "ttft_ms", k: float = 3.5, into: Spikes | None = None) -> Spikes:
    """Requests far above their slice (variant x level x complexity: like with like), found in SQL
    (`Ledger.spike_rows`: median + k x 1.4826 MAD, and 10 % and 1 ms above the median), each with
    its likely cause, added to ``into`` (a new `Spikes` when not given) as they are attributed."""
    out = into if into is not None else Spikes()
    out.add(_attributed(ledger.spike_rows(run_id, metric, k), metric))
    return out


def _attributed(rows: Iterable[dict[str, Any]], metric: str) -> Iterator[Spike]:
    for r in rows:
        cause, why = attribute_spike({**r, metric: r["value"]}, metric, r["first_seq"],
                                     (r["median"], r["prefill_median"]))
        yield Spike(r["id"], r["variant"], r["complexity"], r["case_id"], r["load_level"], metric, r["value"],
                    r["median"], (r["value"] - r["median"]) / r["scale"], cause, why)


# --- capacity, SLOs, summary ---------------------------------------------------------------------


# the workload classes `recommend` judges, each a condition on the case's complexity
WORKLOADS = {
    "interactive long-input": "case_complexity = 'long'",
    "interactive short/medium": "case_complexity in ('short', 'medium')",
    "batch (all, throughput)": "true",
}


def parse_targets(text: str) -> dict[tuple[str, float], float]:
    """`ttft_p99=1500,e2e_p50=8000` -> {("ttft_ms", 99): 1500, ("e2e_ms", 50): 8000}."""
    out: dict[tuple[str, float], float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, val = part.strip().partition("=")
        metric, _, q = key.partition("_p")
        targets = named("target")
        if not eq or metric not in targets or not q.replace(".", "", 1).isdigit():
            raise UsageError(f"--target: '{part}': expected METRIC_pNN=MS with METRIC in {', '.join(targets)} "
                             "(per-request limits such as ttft=2000 go to --slo)")
        try:
            out[(targets[metric].key, float(q))] = float(val)
        except ValueError:
            raise UsageError(f"--target: '{val}' is not a number of milliseconds") from None
    if not out:
        raise UsageError("--target: give at least one goal, e.g. ttft_p99=2000,e2e_p50=10000")
    return out


def recommend(ledger: Ledger, run_id: str, targets: dict[tuple[str, float], float]) -> list[dict[str, Any]]:
    """Per workload class: which variants meet every SLO, with a bootstrap interval on each
    percentile so a pass or a miss that is within noise says so. Each variant at its first load
    level, the baseline's noise-floor passes left out: the rows the report's tables and verdicts use."""
    import random

    run = ledger.require_run(run_id)
    metrics = sorted({m for m, _ in targets})
    out = []
    for g in ledger.first_level_values(run["id"], ledger.baseline(run["id"]), run.repeats, WORKLOADS, metrics):
        checks = []
        for (metric, q), limit in targets.items():
            xs = g[metric]
            est = percentile(xs, q)
            rng = random.Random(0)
            boots = sorted(percentile([xs[rng.randrange(len(xs))] for _ in xs], q) for _ in range(500)) if xs else []
            ci = (percentile(boots, 2.5), percentile(boots, 97.5)) if boots else None
            status = ("no data" if est is None else "meets" if ci and ci[1] <= limit else
                      "misses" if ci and ci[0] > limit else "borderline")
            checks.append({"metric": metric, "q": q, "limit_ms": limit, "estimate_ms": est,
                           "ci95_ms": list(ci) if ci else None, "status": status})
        ok = g["n"] - g["errors"]
        overall = ("no data" if not ok else "meets" if all(c["status"] == "meets" for c in checks) and not g["errors"]
                   else "misses" if any(c["status"] == "misses" for c in checks) else "borderline")
        out.append({"workload": g["group"], "variant": g["variant"], "n": g["n"], "errors": g["errors"],
                    "status": overall, "checks": checks})
    return out


def study_summary(ledger: Ledger, run: Any, baseline: str, report: dict[str, Any], cut: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """The study's table: TTFT tax by complexity, E2E delta on medium generations, KV-cache
    peak and time-weighted mean, preemptions, and the quality ledger, for each variant against the
    baseline, at each variant's first load level: from what the report and the findings computed
    in the ledger (the report's comparisons and its quality table's "all" rows, the slices by
    complexity), no row read. Its counts and means are the cases': the baseline's noise-floor
    passes are not in them."""
    pairs = report["paired"]
    ttft = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "ttft_ms"}
    e2e = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "e2e_ms"}
    whole = {r["variant"]: r for r in report["rows"] if r["complexity"] == "all"}
    spans = ledger.level_outline(run["id"])["spans"]
    out = []
    for v in sorted(ledger.slice_levels(run["id"])):
        mine = [s for s in cut if s["variant"] == v]
        by_cx = {s["complexity"]: s for s in mine}
        entry: dict[str, Any] = {"variant": v, "is_baseline": v == baseline, "n": sum(s["n"] for s in mine),
                                 "errors": sum(s["errors"] for s in mine)}
        for cx in ("short", "medium", "long"):
            t = ttft.get((v, cx))
            entry[f"ttft_mean_{cx}_ms"] = by_cx[cx]["ttft_ms"]["mean"] if cx in by_cx else None
            entry[f"ttft_tax_{cx}_pct"] = t["delta_pct"] if t else None
            entry[f"ttft_tax_{cx}_ci_pct"] = t["ci_pct"] if t else None
        for key, got in (("ttft_tax_all", ttft), ("e2e_delta_all", e2e)):  # every case: any workload has these
            t = got.get((v, "all"))
            entry[f"{key}_pct"], entry[f"{key}_ci_pct"] = (t["delta_pct"], t["ci_pct"]) if t else (None, None)
        m = e2e.get((v, "medium"))
        entry["e2e_mean_medium_ms"] = by_cx["medium"]["e2e_ms"]["mean"] if "medium" in by_cx else None
        entry["e2e_delta_medium_pct"] = m["delta_pct"] if m else None
        entry["e2e_delta_medium_ci_pct"] = m["ci_pct"] if m else None
        entry["ttft_max_ms"] = max((s["ttft_ms"]["max"] for s in mine if s["ttft_ms"]["max"] is not None), default=None)
        entry.update(kv_use(ledger, run["id"], v, request_ends(spans, v)))
        entry["preemptions"] = ledger.series_delta(run["id"], v, "num_preemptions_total") or 0.0
        entry.update(table_quality(whole[v]) if v in whole else quality([], None if v == baseline else []))
        out.append(entry)
    return out


def kv_use(ledger: Ledger, run_id: str, variant: str, ends: dict[Any, float]) -> dict[str, float | None]:
    """KV-cache use over the whole run of a variant: the peak, and the mean over time (each
    server's step series up to its last request, ``ends``: `request_ends`, averaged over its servers)."""
    by: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for x in ledger.server_series(run_id, "kv_cache_usage_perc", variant):
        by[x["replica"]].append((x["mono_ms"], x["value"]))
    means = [time_weighted_mean(pts, ends.get(rep)) for rep, pts in by.items()]
    peak = max((v for pts in by.values() for _, v in pts), default=None)
    return {"kv_cache_peak_pct": None if peak is None else 100 * peak,
            "kv_cache_mean_pct": None if not means else 100 * (mean(means) or 0.0)}


def request_ends(spans: dict[tuple[str, str], dict[Any, tuple[float, float]]], variant: str) -> dict[Any, float]:
    """Each server's last end over a variant's levels (`Ledger.level_outline`'s spans): `kv_use`'s ``ends``."""
    ends: dict[Any, float] = {}
    for (v, _), sp in spans.items():
        if v == variant:
            for rep, (_, hi) in sp.items():
                ends[rep] = max(ends.get(rep, 0.0), hi)
    return ends


def level_findings(ledger: Ledger, run: Any, baseline: str | None, variants: list[dict[str, Any]],
                   order: Iterable[str]) -> dict[str, Any]:
    """What the findings say per load level and over every level, from queries (no row read): the
    levels, capacity and its statement, cost, quality against speed and price, and the traffic
    (trace fidelity, prefix sharing, conversations). ``order``: the variants as the rows first show them."""
    load = run.load
    levels, scores = load_levels(ledger, run["id"], load)
    usage = usage_of(ledger, run["id"], load.get("stop_kv", 0.9))
    costs = cost(variants, levels, run.matrix.get("reference_price"))
    prefix, convs = ledger.traffic_sums(run["id"])
    return {
        "capacity": capacity(variants, levels, run.matrix["generation"]["max_tokens"], usage),
        "capacity_statement": capacity_statement(variants, levels, baseline, load),
        "load_levels": levels,
        "cost": costs,
        "quality_vs_cost": quality_points(scores, costs),
        "trace_fidelity": trace_fidelity(ledger, run["id"], order),
        "prefix_sharing": prefix_sharing(ledger, run["id"], prefix),
        "conversations": conversations(convs),
    }


def findings(ledger: Ledger, run_id: str | None = None, by: list[str] | None = None, k: float = 3.5,
             margins: str | dict[str, Any] | None = None, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report says beyond its tables, from ledger queries and the report's tables.
    ``margins``: non-inferiority margins (the matrix's `margins:` when not given); each variant's
    verdicts (the gate's reading of the first levels) open the findings. The run's rows are read
    only for what a person asked of them, --by's quality; the reviews read only the reviewed
    answers, the grader notes the rows a stretch at a time."""
    run = ledger.require_run(run_id)
    run_id = run["id"]
    use_run(run)  # its graders' margins parse like a built-in's
    specs = parse_margins(margins if margins is not None else run.margins,
                          "--margins" if margins is not None else "matrix margins")
    report = report or build_report(ledger, run_id)
    rows = request_rows(ledger, run_id) if by else None
    baseline = ledger.baseline(run_id)
    lv = level_findings(ledger, run, baseline, ledger.variants(run_id), ledger.slice_levels(run_id))
    qul = quality_under_load(ledger, run_id)
    cut = slices(ledger, run, baseline, by or ["complexity"])
    lf = ledger_findings(ledger, run_id, baseline, specs, run.repeats)  # the order, the machine, accuracy
    _, vs = ledger_verdicts(ledger, run_id, baseline, specs, lf["timeshare"], levels=False)
    revs = review_summary(ledger, run_id, baseline)
    return {
        "run_id": run_id, "baseline": baseline,
        "slices": cut,
        # the baseline's noise-floor passes are drift's, not cases: not counted in any slice
        "by": by or [], "by_quality": by_quality(measured(first_level(rows), baseline, run.repeats), baseline, by,
                                                 flips.flips(ledger, run_id, baseline, by, run.repeats))
        if by and rows is not None else [],  # reporting/by_attr.py
        "paired": report["paired"],
        "multiplicity": report["multiplicity"],
        "verdicts": vs,
        "verdict_lines": sentences(vs, baseline) if baseline else [],
        "timeshare": lf["timeshare"], "accuracy": lf["accuracy"],
        "margins_given": [m.text for m in specs],  # so "no verdict" can say why truthfully
        "spikes": spikes(ledger, run_id, "e2e_ms", k, spikes(ledger, run_id, "ttft_ms", k)),  # a `Spikes`: queries
        "capacity": lv["capacity"],
        "capacity_statement": lv["capacity_statement"],
        "load_levels": lv["load_levels"],
        "cost": lv["cost"],
        "study_summary": study_summary(ledger, run, baseline, report, cut if not by or by == ["complexity"]
                                       else slices(ledger, run, baseline, ["complexity"])) if baseline else [],
        "quality_under_load": qul,
        "quality_vs_cost": lv["quality_vs_cost"],
        **(traffic := {k: lv[k] for k in ("trace_fidelity", "prefix_sharing", "conversations")}),
        "flips": (flip_table := flips.flips(ledger, run_id, baseline)),  # pass/fail changes per case
        "reviews": revs,  # people's verdicts (browse --review)
        "notes": grader_notes(ledger, run_id, rows) + lv["capacity_statement"] + ul_lines(qul)
        + traffic_lines(traffic) + flips.lines(flip_table, specs) + review_lines(revs) + lf["lines"],
    }


def grader_notes(ledger: Ledger, run_id: str, rows: list[dict[str, Any]] | None) -> list[str]:
    """Each grader's `notes` on the rows it declares it can speak of (else every row), read a
    stretch at a time, or on ``rows`` when the caller holds them. The run's stretches are found
    (an ordered pass over its seqs) only when some grader reads every row."""
    graded, every = ledger.measured_graders(run_id), []  # the run's `RunRows`, made once if asked

    def noted(name: str, cls: Any) -> list[dict[str, Any]] | RunRows | NotedRows:
        if rows is not None:
            return rows
        if (fields := declared_notes_where(cls)) is not None:
            return NotedRows(ledger, run_id, name, fields)
        every[:] = every or [RunRows(ledger, run_id)]
        return every[0]  # type: ignore[no-any-return]

    return [line for name, cls in available().items() if _has_notes(cls.aggregate, name, graded)
            for line in hook(cls, "notes", noted(name, cls))]


def _has_notes(agg: Any, grader: str, graded: set[str]) -> bool:
    """Whether an aggregate may have notes: its own `notes`, and (a built-in's read only their
    grader's grades) grades to write them from."""
    if getattr(agg.notes, "__func__", None) is getattr(Aggregate.notes, "__func__", None):
        return False
    return grader in graded or not agg.__module__.startswith("evalkit.")


def report_findings(ledger: Ledger, run_id: str | None = None, *, slo: dict[str, float] | None = None,
                    by: list[str] | None = None, k: float = 3.5, margins: str | dict[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report and its findings, from ledger queries (`build_report`, `findings`): what
    `report`, `run`'s closing lines, `browse` and `publish` read."""
    rid = ledger.require_run(run_id)["id"]
    rep = build_report(ledger, rid, slo)
    return rep, findings(ledger, rid, by, k, margins, report=rep)


def recommend_lines(out: list[dict[str, Any]]) -> list[str]:
    """`recommend`'s answer as text: per workload class, the variants that meet the goals, then
    each variant's evidence."""
    lines = []
    for wl in dict.fromkeys(o["workload"] for o in out):
        rows = [o for o in out if o["workload"] == wl]
        good = [o["variant"] for o in rows if o["status"] == "meets"]
        lines.append(f"{wl}: " + (f"use {', '.join(good)}" if good else "no variant clearly meets the SLOs"))
        for o in rows:
            ev = "; ".join(
                f"{c['metric'].removesuffix('_ms')} p{c['q']:g} {c['estimate_ms'] or 0:,.0f} ms "
                f"[{(c['ci95_ms'] or [0, 0])[0]:,.0f}, {(c['ci95_ms'] or [0, 0])[1]:,.0f}] vs {c['limit_ms']:,.0f} "
                f"({c['status']})" for c in o["checks"])
            lines.append(f"  {o['variant']}: {o['status']} (n={o['n']}, errors={o['errors']}): {ev}")
    return lines
