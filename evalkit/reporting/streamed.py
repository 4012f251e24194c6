"""The report and its findings holding one variant's rows at a time (issue 37), for a report
without --by, --html or reviews (those read every row: `findings.full_report`). Each part is
computed per variant (or per variant against the baseline's first level) and merged in the order
the whole-run version gives it, so the findings are the same to the last digit
(`tests/test_report_scale.py` holds them so)."""

from __future__ import annotations

from typing import Any

from ..grading.base import Aggregate
from ..grading.registry import available, use_run
from ..ledger import Ledger
from . import flips
from .by_attr import measured
from .capacity import capacity, capacity_statement, cost, load_levels
from .findings import findings, full_report, slices, spikes, study_entry
from .plots import mark_frontier, quality_points
from .report import build_report
from .rows import Rows, RunRows, request_rows
from .selection import first_level
from .traffic import conversations, prefix_sharing, trace_fidelity, traffic_lines
from .under_load import lines as ul_lines
from .under_load import quality_under_load
from .verdicts import parse_margins, sentences, verdicts


def streamed_report(ledger: Ledger, run_id: str | None = None, *, slo: dict[str, float] | None = None,
                    by: list[str] | None = None, k: float = 3.5, margins: str | dict[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`findings.full_report`'s report and findings (not its rows), holding one variant's rows at
    a time; with --by or reviews, read with every row as before."""
    run = ledger.require_run(run_id)
    if by or ledger.reviews(run["id"]):
        rep, fnd, _ = full_report(ledger, run["id"], slo=slo, by=by, k=k, margins=margins)
        return rep, fnd
    rep = build_report(ledger, run["id"], slo)
    if not rep["rows"] and not ledger.slice_levels(run["id"]):  # no rows: nothing to stream
        return rep, findings(ledger, run["id"], None, k, margins, report=rep)
    use_run(run)  # its graders' margins parse like a built-in's
    specs = parse_margins(margins if margins is not None else run.margins,
                          "--margins" if margins is not None else "matrix margins")
    return rep, streamed_findings(ledger, run, specs, k, rep)


def streamed_findings(ledger: Ledger, run: Any, specs: list[Any], k: float, report: dict[str, Any] | None) -> dict[str, Any]:
    """`findings` holding one variant's rows at a time (all its levels), the baseline's first
    level beside them: every part below is per variant (or per variant against the baseline) and
    merged in the order the whole-run version gives. The grader notes read the run in one ordered
    pass a stretch at a time (`RunRows`). The same findings, to the last digit."""
    run_id = run["id"]
    report = report or build_report(ledger, run_id)
    baseline = ledger.baseline(run_id)
    load = run.load
    variants = ledger.variants(run_id)
    by_name = {v["name"]: v for v in variants}
    levels_of = ledger.slice_levels(run_id)  # variants in the order the rows first show them
    base_first = request_rows(ledger, run_id, baseline, min(levels_of[baseline])) \
        if baseline in levels_of else Rows()
    base_ok = [r for r in base_first if r["error_class"] is None]
    # the baseline's first noise-floor pass, from every variant's first level (`flips._floor_repeat`)
    reps = {v: ledger.slice_repeats(run_id, v, min(ls)) for v, ls in levels_of.items()}
    others = set().union(*(r for v, r in reps.items() if v != baseline))
    extra = sorted(reps.get(baseline, set()) - others)
    floor_rep = extra[0] if extra and others else None
    pairs = report["paired"]
    ttft = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "ttft_ms"}
    e2e = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "e2e_ms"}
    part: dict[str, dict[str, Any]] = {}
    for v in levels_of:
        vrows = request_rows(ledger, run_id, v)
        vfirst = first_level(vrows)
        lv = load_levels(vrows, load, ledger, run_id)
        vcost = cost(variants, lv, run.matrix.get("reference_price"))
        both = vfirst if v == baseline else Rows([*base_first, *vfirst])
        part[v] = {
            "levels": lv, "cost": vcost, "qul": quality_under_load(vrows),
            "slices": slices(measured(vfirst, baseline, run.repeats), ["complexity"]),
            "verdicts": [] if v == baseline else verdicts(both, baseline, specs),
            "spikes": (spikes(vrows, "ttft_ms", k), spikes(vrows, "e2e_ms", k)),
            "capacity": capacity([by_name[v]], vrows, lv, run.matrix["generation"]["max_tokens"],
                                 load.get("stop_kv", 0.9)) if v in by_name else [],
            "study": study_entry(ledger, run_id, v, vfirst, vrows, baseline, base_ok, ttft, e2e) if baseline else None,
            "points": quality_points(vrows, lv, vcost),
            "trace": trace_fidelity(vrows), "prefix": prefix_sharing(ledger, run_id, vrows),
            "conversations": conversations(vrows),
            "flips": [] if v == baseline else flips.flips(both, baseline, floor_rep),
        }
        del vrows, vfirst, both  # the next variant's rows replace these
    names = sorted(part)
    levels = sorted((x for v in names for x in part[v]["levels"]), key=lambda x: (x["variant"], x["concurrency"], x["level"]))
    costs = [c for v in names for c in part[v]["cost"]]
    capacity_lines = capacity_statement(variants, levels, baseline, load)
    qul = [e for v in levels_of for e in part[v]["qul"]]
    vs = [e for v in names for e in part[v]["verdicts"]]
    traffic = {"trace_fidelity": [e for v in levels_of for e in part[v]["trace"]],
               "prefix_sharing": [e for v in levels_of for e in part[v]["prefix"]],
               "conversations": [e for v in levels_of for e in part[v]["conversations"]]}
    flip_table = [e for v in names for e in part[v]["flips"]]
    everything = RunRows(ledger, run_id)
    graded = ledger.measured_graders(run_id)
    notes = [line for name, cls in available().items() if _has_notes(cls.aggregate, name, graded)
             for line in cls.aggregate.notes(everything)]  # type: ignore[arg-type]
    return {
        "run_id": run_id, "baseline": baseline,
        "slices": sorted((e for v in names for e in part[v]["slices"]),
                         key=lambda e: (str(e["variant"]), str(e["complexity"]))),
        "by": [], "by_quality": [],
        "paired": report["paired"],
        "multiplicity": report["multiplicity"],
        "verdicts": vs,
        "verdict_lines": sentences(vs, baseline) if baseline else [],
        "margins_given": [m.text for m in specs],
        "spikes": [s for v in names for s in part[v]["spikes"][0]] + [s for v in names for s in part[v]["spikes"][1]],
        "capacity": [c for v in variants for c in (part[v["name"]]["capacity"] if v["name"] in part else
                                                   capacity([v], [], levels, run.matrix["generation"]["max_tokens"],
                                                            load.get("stop_kv", 0.9)))],
        "capacity_statement": capacity_lines,
        "load_levels": levels,
        "cost": costs,
        "study_summary": [part[v]["study"] for v in names] if baseline else [],
        "quality_under_load": qul,
        "quality_vs_cost": mark_frontier([e for v in names for e in part[v]["points"]]),
        **traffic,
        "flips": flip_table,
        "reviews": None,  # reviews are read with every row (`findings` takes that path when there are any)
        "notes": notes + capacity_lines + ul_lines(qul) + traffic_lines(traffic) + flips.lines(flip_table, specs),
    }


def _has_notes(agg: Any, grader: str, graded: set[str]) -> bool:
    """Whether an aggregate may have notes: its own `notes`, and (a built-in's read only their
    grader's grades) grades to write them from."""
    if getattr(agg.notes, "__func__", None) is getattr(Aggregate.notes, "__func__", None):
        return False
    return grader in graded or not agg.__module__.startswith("evalkit.")
