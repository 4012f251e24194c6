"""Per variant x complexity: latency distribution, schema pass rate, delta against the baseline."""

from __future__ import annotations

import json
from array import array
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .. import catalogue
from ..catalogue import KEYS, Metric, fmt
from ..errors import PluginError
from ..execution.resume import run_state
from ..grading import grade_failures
from ..grading.base import declared_case_summary, declared_summary, hook
from ..grading.registry import available, summary_columns, use_run
from ..grading.sample import sample_line
from ..host import hosts_differ
from ..ledger import Ledger
from ..spec.dataset import COMPLEXITIES
from ..stats import mean, pct_delta, percentile, robust_ratio
from .grade_views import grades_by_grader
from .rows import give_back, request_rows
from .rowseq import take, where
from .selection import level_note
from .spike_summary import bounded
from .verdicts import apply_holm, flag, multiplicity_notes

SLICES = (*COMPLEXITIES, "all")


def _grades_by_grader(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each grader's grades over the rows, with their case: one pass, whatever the graders. Rows
    read from the ledger give them as views onto the grade columns (`rows.grades_by_grader`)."""
    if (viewed := grades_by_grader(rows)) is not None:
        return viewed  # type: ignore[return-value]
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for name, g in r["grades"].items():
            out[name].append({**g, "case_id": r["case_id"]})
    return out


def quality(rows: list[dict[str, Any]], base_rows: list[dict[str, Any]] | None = None,
            computed: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Quality aggregates over rows carrying their newest grades (failed requests have none): each
    registered grader summarises its own grades. ``base_rows``: the baseline's same slice, for
    per-pair graders (None when these rows are the baseline's own). ``computed``: the summaries
    the ledger computed of the graders that declare them (`Ledger.grader_summaries`), whose grades
    the rows do not carry (a grader without grades in the slice: its summary of none)."""
    out: dict[str, Any] = {}
    mine = _grades_by_grader(rows)
    base = None if base_rows is None else _grades_by_grader(base_rows)
    for name, cls in available().items():
        if computed and name in computed:
            out.update(computed[name])
            continue
        out.update(hook(cls, "summarise", mine.get(name, []), None if base is None else base.get(name, [])))
    return out


def quality_columns(graders: list[str] | None = None) -> list[Metric]:
    """The quality table: variant, slice, then every registered grader's summary columns."""
    return [*KEYS, *summary_columns(graders)]


def paired(cases: Iterable[tuple[str, str, Any, float, float]], metric: str, by: str = "complexity"
           ) -> list[dict[str, Any]]:
    """Candidate against baseline on the same cases, per slice: the % difference of the means,
    tested as the verdicts test it (`stats.robust_ratio`: sign-flip and bootstrap-t tests of the
    ratio of means, all must reject). ``cases``: (candidate, case, slice value, its mean, the
    baseline's; None where a side has no successful request), each side's repeats averaged
    (`Ledger.case_pairs`). Each entry keeps its test
    (``_test``) until `verdicts.apply_holm` prints its interval at the family's Holm level."""
    out = []
    per: dict[str, dict[str, dict[str, tuple[float | None, float | None]]]] = defaultdict(lambda: defaultdict(dict))
    for v, case, value, a, b in cases:
        if value is not None:  # a workload without the slice has only "all"
            per[v][str(value)][case] = (a, b)
        per[v]["all"][case] = (a, b)
    for v in sorted(per):
        for s, got in sorted(per[v].items(), key=lambda kv: (kv[0] == "all", kv[0])):
            cs = sorted(c for c, (a, b) in got.items() if a is not None and b is not None)
            xs, ys = [got[c][0] for c in cs], [got[c][1] for c in cs]
            t = robust_ratio(xs, ys)  # the verdicts' test: one road
            bm, vm = mean(ys), mean(xs)
            out.append({
                "variant": v, by: s, "metric": metric, "pairs": t.n, "baseline_mean": bm, "variant_mean": vm,
                "delta": None if bm is None or vm is None else vm - bm, "delta_pct": t.estimate,
                "p": t.p(0.0) if t.n >= 2 else None, "method": t.method, "_test": t,
            })
            iv = t.interval(0.05, (0.0,)) if t.n >= 2 else None  # alone: 95 %; apply_holm sets the family's level
            out[-1].update({"ci_pct": list(iv) if iv else None, "ci_level": 0.95, "verdict": flag(iv, v, metric)})
    return out


def build_report(ledger: Ledger, run_id: str | None = None, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The report's tables and comparisons: the latencies and the declared graders' quality from
    SQL (`slice_table`, `case_pairs`, `grader_summaries`), what spans the run (levels, arrivals,
    the client's check) from SQL and one ordered pass; the rows are read, one variant's first level
    at a time (the baseline's beside it), only for the grades of a grader that declares no summary."""
    run = ledger.require_run(run_id)
    run_id = run["id"]
    use_run(run)  # a run's module:Class graders declare its quality columns
    variants = ledger.variants(run_id)
    baseline = next((v["name"] for v in variants if v["is_baseline"]), None)
    if slo is None:
        slo = {k: run.load[f"slo_{k}_ms"] for k in ("ttft", "tpot", "e2e") if run.load.get(f"slo_{k}_ms") is not None}
    tel = run.matrix.get("telemetry") or {}
    threshold = float(tel.get("client_lag_threshold_ms", 5.0))
    # A sweep's levels are not one population: pooled, the higher levels' queueing would read as
    # the variant's latency. The tables keep each variant's first level; the load-levels table
    # in the findings has every level.
    levels = ledger.slice_levels(run_id)
    graders = sorted(ledger.measured_graders(run_id))
    # the quality of each grader that declares its summary is SQL's; the rows are read for the
    # others' grades alone, where they have any; a grader the run recorded that cannot be imported
    # any more has no columns: its grades stay unread
    declared = {g: sql for g in graders if g in available() and (sql := declared_summary(available()[g])) is not None}
    summaries, floor_n = ledger.grader_summaries(run_id, baseline, run.repeats, declared)
    cased = case_summaries(ledger, run_id, baseline, run.repeats, [g for g in graders if g not in declared])
    for key, got in cased.items():
        summaries.setdefault(key, {}).update(got)
    read = [g for g in graders if g not in declared and not any(g in got for got in cased.values())]

    def first_of(v: str) -> Any:
        return request_rows(ledger, run_id, v, min(levels[v]), only={"variant", "repeat"},
                            graders=read) if v in levels and read else []

    arr = streamed_arrivals(ledger, run_id, run.load)
    client = client_check(ledger.client_lag(run_id), ledger.level_marks(run_id), threshold)
    swept = any(len(v) > 1 for v in levels.values())
    # the baseline's noise-floor passes (repeats past the run's own) serve drift's floor: they are
    # not cases, so the tables count the measured repeats only
    repeats = run.repeats
    base_first = first_of(baseline) if baseline else []
    base_cases = where(base_first, (r["repeat"] < repeats for r in base_first))
    base_groups = {"cases": base_cases, "index": _slices(base_cases)}
    entries: dict[str, list[dict[str, Any]]] = {}
    names = list(dict.fromkeys([*(v["name"] for v in variants), *sorted(levels)]))
    # every declared metric per variant x slice, in SQL over each variant's first level
    metrics = ledger.slice_table(run_id, baseline, repeats, [m for m in catalogue.REPORT if m.agg], slo)
    for name in sorted(names, key=lambda n: n != baseline):  # the baseline's own parts first: then it is compared with
        if name == baseline:
            vcases, vfirst = base_cases, base_first
        else:
            vfirst = first_of(name)
            vcases = vfirst
        if name in {v["name"] for v in variants}:
            entries[name] = _variant_table(ledger, run_id, name, vcases, baseline, base_groups, metrics, summaries)
        del vfirst, vcases  # one candidate's slice at a time: gone before the next is read
        give_back()
    table = [e for v in variants for e in entries.get(v["name"], [])]
    base_rows = {r["complexity"]: r for r in table if r["variant"] == baseline}
    for r in table:
        b = base_rows.get(r["complexity"])
        r["ttft_p50_delta_pct"] = pct_delta(r["ttft_p50_ms"], b and b["ttft_p50_ms"])
        r["e2e_mean_delta_pct"] = pct_delta(r["e2e_mean_ms"], b and b["e2e_mean_ms"])
    # paired against the baseline on the same cases: per-case means in SQL
    per_case = ledger.case_pairs_many(run_id, baseline, repeats, ("ttft_ms", "e2e_ms", "tpot_ms")) if baseline else {}
    pairs = [p for m, rows in per_case.items() for p in paired(rows, m)]
    multiplicity = apply_holm(table, pairs, baseline)
    attempts = ledger.attempt_counts(run_id)
    return {
        "run": {**{k: run[k] for k in ("id", "created_at", "finished_at", "status", "matrix_name",
                                       "dataset_hash", "n_cases", "evalkit_version")},
                "state": run_state(run), "stop_reason": run.get("stop_reason"), "source": run.get("source")},
        "baseline": baseline,
        "grade_sample": sample_line(json.loads(run["grade_sample_json"]) if run.get("grade_sample_json") else None),
        "slo_ms": slo,
        "load": run.load,
        "variants": [{**{k: v.get(k) for k in ("name", "is_baseline", "model", "engine", "engine_version",
                                               "quantization", "dtype", "dtype_reason", "status", "error", "ready_s",
                                               "metrics_available", "exit_code")},
                      **attempts.get(v["name"], {})} for v in variants],
        "rows": table,
        "arrivals": arr,
        "notes": arrival_notes(arr) + client_notes(client) + multiplicity_notes(multiplicity)
        + ([level_note(levels)] if swept else [])
        + ([f"{baseline}: its {floor_n} noise-floor pass(es) (repeats past the run's {repeats}) are not in the tables: "
            "they are drift's floor, not cases"] if floor_n else [])
        + grade_failures(ledger, run_id),  # a grader that raised: which, on how many, the first case
        "table_level": {v: min(ls) for v, ls in levels.items()} if swept else None,
        "client": client,
        "paired": pairs,
        "matrix_margins": run.margins,
        "multiplicity": multiplicity,
        "graders": graders,
        "host": ledger.host(run.get("host_id")),
        "host_warning": hosts_differ(ledger.run_hosts(run["matrix_name"])),
    }


def case_summaries(ledger: Ledger, run_id: str, baseline: str | None, repeats: int, graders: list[str]
                   ) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(variant, complexity or "all") -> grader -> its quality, for each of ``graders`` that declares
    it through per-case values (`Aggregate.summary_from_cases`, e.g. drift against the baseline's
    noise floor): from the per-case values the ledger computes (`Ledger.slice_case_values`), no
    grade read. Every variant with measured rows gets every slice a graded case is in."""
    cased = {g: c for g in graders if g in available() and (c := declared_case_summary(available()[g])) is not None}
    if not cased:
        return {}
    margins = [(g, m, cv, theirs[m]) for g, (mine, theirs) in cased.items() for m, cv in mine.items() if m in theirs]
    values, slice_of = ledger.slice_case_values(run_id, baseline, repeats, margins)
    slices = [*sorted({str(c) for c in slice_of.values() if c is not None}), "all"]
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for s in slices:
        def side(v: str, ms: Iterable[str], s: str = s) -> dict[str, dict[str, float]]:
            return {m: {c: x for c, x in values.get((v, m), {}).items() if s == "all" or slice_of.get(c) == s}
                    for m in ms}

        for g, (mine, theirs) in cased.items():
            base = side(baseline, theirs) if baseline else {}
            for v in ledger.slice_levels(run_id):
                got = hook(available()[g], "summary_from_cases", None if v == baseline else side(v, mine), base)
                if not isinstance(got, dict):  # declared, so a dict of its columns: anything else is one line
                    raise PluginError(f"grader '{g}': its aggregate's hook `summary_from_cases` returned "
                                      f"{type(got).__name__}, not a dict of column key -> value")
                out.setdefault((v, s), {})[g] = got
    return out


def table_quality(row: dict[str, Any]) -> dict[str, Any]:
    """A table row's graders' columns, as `quality` gave them: `_variant_table` puts them after its
    metrics and `preemptions`; `build_report` adds the deltas to the baseline, then Holm's p-values,
    after them."""
    keys = list(row)
    return {k: row[k] for k in keys[keys.index("preemptions") + 1:keys.index("ttft_p50_delta_pct")]}


def _slices(cases: list[dict[str, Any]]) -> dict[str, array[int]]:
    """Slice (a complexity, or "all") -> the places of its rows in ``cases``: 8 bytes a row."""
    index: dict[str, array[int]] = defaultdict(lambda: array("q"))
    for i, r in enumerate(cases):
        index[r["complexity"]].append(i)
        index["all"].append(i)
    return index


def _variant_table(ledger: Ledger, run_id: str, variant: str, cases: list[dict[str, Any]], baseline: str | None,
                   base: dict[str, Any], metrics: dict[tuple[str, str], dict[str, Any]],
                   summaries: dict[tuple[str, str], dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One variant's rows of the tables: per slice its metrics (``metrics``: `Ledger.slice_table`'s)
    and quality (against the baseline's same slice), from that variant's cases only; ``summaries``:
    the declared graders' quality, computed in the ledger (`Ledger.grader_summaries`; their grades
    are not in ``cases``)."""
    index = _slices(cases)
    out = []
    for s in SLICES:
        if (got := metrics.get((variant, s))) is None:
            continue
        entry = {"variant": variant, "complexity": s, **got}
        # the server's preemption counter over the run: per variant, so on its "all" row only
        entry["preemptions"] = ledger.series_delta(run_id, variant, "num_preemptions_total") if s == "all" else None
        mine = take(cases, index[s])  # views made when read, as the slice's are
        theirs = None if variant == baseline else take(base["cases"], base["index"].get(s, ()))
        entry.update(quality(mine, theirs, summaries.get((variant, s))))
        out.append(entry)
    return out


def max_in_flight(intervals: list[tuple[float, float]]) -> int:
    """The most requests open at once, from (send, end) times."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def arrivals(rows: list[dict[str, Any]], load: dict[str, Any]) -> list[dict[str, Any]]:
    """Open-loop runs: per variant and level, the requested and achieved arrival rate, how far
    sends fell behind the schedule (event-loop lateness plus any cap's wait), and the most
    requests in flight. A warning when the client could not keep the schedule."""
    if not load.get("rate"):
        return []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("scheduled_ms") is not None and r.get("sent_ms") is not None:
            groups[(r["variant"], r["level"] or "main")].append(r)
    out = []
    for (variant, level), rs in sorted(groups.items()):
        sent = sorted(r["sent_ms"] for r in rs)
        lag = [r["sent_ms"] - r["scheduled_ms"] for r in rs]
        span_s = (sent[-1] - sent[0]) / 1000.0
        achieved = (len(sent) - 1) / span_s if span_s > 0 else None
        gap_ms = 1000.0 / load["rate"]
        p99 = percentile(lag, 99) or 0.0
        entry = {
            "variant": variant, "level": level, "n": len(rs), "requested_rps": load["rate"],
            "achieved_rps": achieved, "arrival": load.get("arrival", "poisson"),
            "max_concurrency": load.get("max_concurrency"),
            "lag_p50_ms": percentile(lag, 50), "lag_p99_ms": p99, "lag_max_ms": max(lag),
            "max_in_flight": max_in_flight([(r["sent_ms"], r["sent_ms"] + (r["e2e_ms"] or 0.0)) for r in rs]),
        }
        entry["warning"] = (f"the client fell behind its schedule (send lag p99 {p99:,.0f} ms vs a mean gap of "
                            f"{gap_ms:,.0f} ms): TTFT from the schedule includes that wait"
                            if p99 > max(50.0, 0.1 * gap_ms) else None)
        out.append(entry)
    return out


def latency_columns() -> list[Metric]:
    """The latency table's columns, read from the catalogue at each call (one declaration adds one)."""
    m = catalogue.metrics()
    return [*catalogue.KEYS, *(m[k] for k in catalogue.LATENCY_TABLE)]


def server_columns() -> list[Metric]:
    m = catalogue.metrics()
    return [*catalogue.KEYS, *(m[k] for k in catalogue.SERVER_TABLE)]


def table_cells(report: dict[str, Any], columns: list[Metric] | None = None) -> tuple[list[str], list[list[str]]]:
    """A table's header and cells, every value through the catalogue's one formatter."""
    columns = columns or latency_columns()
    return [m.label for m in columns], [[fmt(m, r.get(m.key)) for m in columns] for r in report["rows"]]


def markdown_table(report: dict[str, Any], columns: list[Metric] | None = None) -> str:
    header, body = table_cells(report, columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def to_json(report: dict[str, Any]) -> str:
    """The report as JSON; its findings' spikes bounded (`spike_summary.bounded`: the full list is
    the ledger's derived_spikes table), so the document stays small at any size."""
    if isinstance(report.get("findings"), dict) and "spikes" in report["findings"]:
        report = {**report, "findings": bounded(report["findings"])}
    return json.dumps(report, indent=2, ensure_ascii=False)


def streamed_arrivals(ledger: Ledger, run_id: str, load: dict[str, Any]) -> list[dict[str, Any]]:
    """`arrivals` from one ordered pass over the five columns it reads (no other column held)."""
    if not load.get("rate"):
        return []
    names = ("variant", "level", "scheduled_ms", "sent_ms", "e2e_ms")
    rows = [dict(zip(names, t, strict=True))
            for chunk in ledger.measured_columns(run_id, list(names)) for t in chunk if t[2] is not None and t[3] is not None]
    return arrivals(rows, load)


def arrival_notes(arr: list[dict[str, Any]]) -> list[str]:
    """One line per open-loop variant and level: requested vs achieved, send lag, in flight."""
    out = []
    for a in arr:
        out.append(f"arrivals {a['variant']} {a['level']}: {a['arrival']} at {a['requested_rps']:g}/s requested, "
                   f"{a['achieved_rps'] or 0:.2f}/s achieved over {a['n']} requests; send lag p50/p99/max "
                   f"{a['lag_p50_ms']:,.1f}/{a['lag_p99_ms']:,.1f}/{a['lag_max_ms']:,.1f} ms; "
                   f"max in flight {a['max_in_flight']}"
                   + (f" (cap {a['max_concurrency']})" if a["max_concurrency"] else " (uncapped)"))
        if a["warning"]:
            out.append(f"warning: {a['variant']}: {a['warning']}")
    return out


def client_check(lag: list[dict[str, Any]], marks: dict[str, tuple[int, set[str], int]], threshold_ms: float
                 ) -> list[dict[str, Any]]:
    """The client's self-check per load level: its event loop's lag (p99 and worst, over every
    window of the level and every sending process), which clock stamped the rows, and how many
    rows are marked as timings the client's own load may have bent. ``marks``: `Ledger.level_marks`."""
    out = []
    for level in dict.fromkeys([x["level"] for x in lag] + list(marks)):
        lags = [x["lag_ms"] for x in lag if x["level"] == level]
        n, sources, suspect = marks.get(level, (0, set(), 0))
        out.append({"level": level, "lag_p99_ms": percentile(lags, 99), "lag_max_ms": max(lags) if lags else None,
                    "rows": n, "sources": sorted(sources), "suspect": suspect, "threshold_ms": threshold_ms,
                    "client_bound": bool(lags) and (percentile(lags, 99) or 0.0) > threshold_ms})
    return out


def client_notes(checks: list[dict[str, Any]]) -> list[str]:
    out = []
    for c in checks:
        if not c["client_bound"] and not c["suspect"]:
            continue
        line = f"client lag p99 {c['lag_p99_ms'] or 0:,.1f} ms (max {c['lag_max_ms'] or 0:,.1f}) during {c['level']}: "
        if "user" in c["sources"]:
            line += ("the client, not the server, was the bottleneck; TTFT from user-space stamps is not trustworthy "
                     f"at this load ({c['suspect']} of {c['rows']} rows marked timing_suspect)")
        else:
            line += (f"kernel receive stamps keep TTFT exact, except {c['suspect']} of {c['rows']} rows whose first "
                     "token shared a read with later ones (timing_suspect)")
        out.append(line)
    return out
