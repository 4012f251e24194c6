"""The report and its findings holding one variant's rows at a time (issue 37), for a report
without --by, --html or reviews (those read every row: `findings.full_report`). Each part is
computed per variant (or per variant against the baseline's first level) and merged in the order
the whole-run version gives it, so the findings are the same to the last digit
(`tests/test_report_scale.py` holds them so)."""

from __future__ import annotations

from typing import Any

from ..grading.base import Aggregate, declared_notes_where, hook
from ..grading.registry import available, use_run
from ..ledger import Ledger
from . import flips
from .by_attr import measured
from .findings import findings, full_report, level_findings, request_ends, slice_quality, slices, spikes, study_entry
from .ledger_findings import ledger_findings
from .report import build_report
from .rows import NotedRows, Rows, RunRows, big_buffers_apart, give_back, keep_columns, request_rows
from .rowseq import succeeded
from .selection import COMPARED, first_level
from .traffic import traffic_lines
from .under_load import lines as ul_lines
from .under_load import quality_under_load
from .verdicts import parse_margins, sentences, verdicts


def streamed_report(ledger: Ledger, run_id: str | None = None, *, slo: dict[str, float] | None = None,
                    by: list[str] | None = None, k: float = 3.5, margins: str | dict[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`findings.full_report`'s report and findings (not its rows), holding one variant's rows at
    a time; with --by or reviews, read with every row as before."""
    big_buffers_apart()
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
    """`findings` holding one variant x load level's rows at a time, the baseline's first level
    beside each variant's first (every first level is read before any other level): each part
    below is per level (what it needs of the variant's other levels comes from
    `Ledger.level_outline` in SQL, or is added up a level at a time), per variant against the
    baseline's first level, and merged in the order the whole-run version gives. The grader notes
    read the run in one ordered pass a stretch at a time (`RunRows`). The same findings, to the
    last digit (`tests/test_report_scale.py`)."""
    run_id = run["id"]
    report = report or build_report(ledger, run_id)
    baseline = ledger.baseline(run_id)
    lf = ledger_findings(ledger, run_id, baseline, specs, run.repeats)  # the order, the machine, accuracy: in SQL
    ts = lf["timeshare"]
    variants = ledger.variants(run_id)
    levels_of = ledger.slice_levels(run_id)  # variants in the order the rows first show them
    outline = ledger.level_outline(run_id)
    cut = slices(ledger, run, baseline, ["complexity"])  # in SQL; each variant's graders' columns added below
    first = (request_rows(ledger, run_id, baseline, min(levels_of[baseline]), only=COMPARED) if baseline in levels_of
             else Rows())
    # let go after the first levels; its cases without the noise-floor passes, as every table counts them
    base = {"first": first, "cases_ok": succeeded(measured(first, baseline, run.repeats))}
    del first
    pairs = report["paired"]
    ttft = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "ttft_ms"}
    e2e = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "e2e_ms"}
    part: dict[str, dict[str, Any]] = {}

    def level(v: str, rows: Rows) -> None:
        """Variant v's first level (or every level, `_first_rows`) with the baseline's beside it."""
        p = part[v]
        vfirst = first_level(rows)
        both = vfirst if v == baseline else Rows.chain(base["first"], vfirst)
        slice_quality(cut, measured(vfirst, baseline, run.repeats), ["complexity"])
        p["verdicts"] = [] if v == baseline else verdicts(both, baseline, specs, time=ts)
        p["study"] = study_entry(ledger, run_id, v, measured(vfirst, baseline, run.repeats), None, baseline,
                                 base["cases_ok"], ttft, e2e, ends=request_ends(outline["spans"], v)) if baseline else None

    # every variant's first level while the baseline's is held (its own first, then kept as far as a
    # comparison reads it): what the findings say of every level comes from queries
    for v in sorted(levels_of, key=lambda v: v != baseline):
        part[v] = {}
        whole = _first_rows(v, outline)
        level(v, base["first"] if v == baseline and not whole
              else request_rows(ledger, run_id, v, None if whole else min(levels_of[v]), only=COMPARED))
        if v == baseline:
            keep_columns(base["first"], COMPARED)
        give_back()
    base.clear()
    give_back()
    names = sorted(part)
    lvf = level_findings(ledger, run, baseline, variants, levels_of)
    qul = quality_under_load(ledger, run_id)
    vs = [e for v in names for e in part[v]["verdicts"]]
    traffic = {k: lvf[k] for k in ("trace_fidelity", "prefix_sharing", "conversations")}
    flip_table = flips.flips(ledger, run_id, baseline)
    everything = RunRows(ledger, run_id)
    graded = ledger.measured_graders(run_id)
    notes = [line for name, cls in available().items() if _has_notes(cls.aggregate, name, graded)
             for line in hook(cls, "notes", _noted(ledger, run_id, name, cls, everything))]
    return {
        "run_id": run_id, "baseline": baseline,
        "slices": cut,
        "by": [], "by_quality": [],
        "paired": report["paired"],
        "multiplicity": report["multiplicity"],
        "verdicts": vs,
        "verdict_lines": sentences(vs, baseline) if baseline else [],
        "timeshare": ts, "accuracy": lf["accuracy"],
        "margins_given": [m.text for m in specs],
        "spikes": spikes(ledger, run_id, "ttft_ms", k) + spikes(ledger, run_id, "e2e_ms", k),
        "capacity": lvf["capacity"],
        "capacity_statement": lvf["capacity_statement"],
        "load_levels": lvf["load_levels"],
        "cost": lvf["cost"],
        "study_summary": [part[v]["study"] for v in names] if baseline else [],
        "quality_under_load": qul,
        "quality_vs_cost": lvf["quality_vs_cost"],
        **traffic,
        "flips": flip_table,
        "reviews": None,  # reviews are read with every row (`findings` takes that path when there are any)
        "notes": notes + lvf["capacity_statement"] + ul_lines(qul) + traffic_lines(traffic)
        + flips.lines(flip_table, specs) + lf["lines"],
    }


def _first_rows(variant: str, outline: dict[str, Any]) -> bool:
    """Whether a variant's first level is read with every row of it (then cut by `first_level`):
    when one of its level labels spans several concurrencies, so the first level's reader would
    not see that label whole."""
    return any(len(ls) > 1 for (v, _), ls in outline["slices"].items() if v == variant)


def _noted(ledger: Ledger, run_id: str, name: str, cls: Any, everything: RunRows) -> RunRows | NotedRows:
    """The rows a grader's `notes` is handed: those it declares it can speak of, else every row."""
    fields = declared_notes_where(cls)
    return everything if fields is None else NotedRows(ledger, run_id, name, fields)


def _has_notes(agg: Any, grader: str, graded: set[str]) -> bool:
    """Whether an aggregate may have notes: its own `notes`, and (a built-in's read only their
    grader's grades) grades to write them from."""
    if getattr(agg.notes, "__func__", None) is getattr(Aggregate.notes, "__func__", None):
        return False
    return grader in graded or not agg.__module__.startswith("evalkit.")
