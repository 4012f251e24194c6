"""A gate for pipelines: thresholds on a run, one line per failure, JUnit XML for CI systems, so
a model or engine upgrade can be gated the way prompt changes are."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..catalogue import Metric
from ..errors import UsageError
from ..grading.base import Threshold
from ..grading.registry import thresholds as registry_thresholds
from ..grading.registry import use_run
from ..ledger import Ledger
from .findings import parse_targets
from .report import build_report
from .timeshare import timeshare
from .verdicts import MarginSpec, counts_text, fmt_estimate, ledger_verdicts, level_text, parse_margins


@dataclass
class Check:
    variant: str
    name: str
    value: float | None
    limit: float
    passed: bool
    message: str
    decided: bool = True  # False: a margin the run could not decide (inconclusive), counted apart


@dataclass
class GateSpec:
    """What `evalkit check` checks: grader thresholds (NAME -> limit, each grader declares its
    own), the failed-request rate, percentile targets, non-inferiority margins."""

    thresholds: dict[str, float] = field(default_factory=dict)
    max_error_rate: float | None = None
    targets: dict[tuple[str, float], float] = field(default_factory=dict)  # (metric, percentile) -> ms
    margins: list[MarginSpec] = field(default_factory=list)
    max_client_lag_ms: float | None = None
    require_decided: bool = False  # an undecided margin fails the gate

    @classmethod
    def from_options(cls, thresholds: list[str], max_error_rate: float | None, target: str | None,
                     margins: str | None, max_client_lag_ms: float | None = None,
                     require_decided: bool = False) -> GateSpec:
        known = registry_thresholds()
        out: dict[str, float] = {}
        for item in thresholds:
            name, eq, val = item.partition("=")
            name = name.strip()
            if name not in known:
                raise UsageError(f"--threshold: unknown name '{name}' (known: {', '.join(sorted(known))}; "
                                 "`evalkit graders list` shows each grader's)")
            th = known[name][1]
            out[name] = threshold_value(item, name, val, th.scale == 100.0)
        return cls(out, max_error_rate, parse_targets(target) if target else {}, parse_margins(margins),
                   max_client_lag_ms, require_decided)

    def empty(self) -> bool:
        return (not self.thresholds and self.max_error_rate is None and not self.targets and not self.margins
                and self.max_client_lag_ms is None)


def threshold_value(item: str, name: str, val: str, share: bool) -> float:
    """A threshold's limit: a share may be given as 0-1 or in % (or pp, the unit its margin takes:
    `top1_agreement=95%` and `top1_agreement=-2pp` speak of the same points)."""
    text = val.strip()
    pct = share and text.endswith(("%", "pp"))
    try:
        x = float(text.removesuffix("%").removesuffix("pp")) / (100.0 if pct else 1.0)
    except ValueError:
        raise UsageError(f"--threshold: '{item}': expected NAME=NUMBER" + (" (0-1, or in %)" if share else "")) from None
    if share and not 0 <= x <= 1:
        raise UsageError(f"--threshold: '{item}': {name} is a share: 0-1, or 0-100 %")
    return x


def _check(variant: str, name: str, value: float | None, limit: float, ok: bool | None, text: str) -> Check:
    if value is None or ok is None:
        return Check(variant, name, value, limit, False, f"{name}: no data to check ({text})")
    return Check(variant, name, value, limit, ok, text)


def threshold_check(variant: str, row: dict[str, Any], name: str, th: Threshold, limit: float) -> Check:
    """One grader threshold on a variant's "all" row."""
    raw = row.get(th.key)
    value = None if raw is None else raw / th.scale
    ci = row.get(th.ci_key) if th.ci_key else None
    if th.ci_key:
        ok = None if not ci else (ci[0] <= limit if th.direction == "max" else ci[1] >= limit)
        text = (f"{name} {value or 0:+.3f}, 95 % CI [{ci[0]:+.3f}, {ci[1]:+.3f}] (fails when the interval lies "
                f"{'above' if th.direction == 'max' else 'below'} {limit:+.3f})" if ci else "too few pairs")
    else:
        ok = None if value is None else (value >= limit if th.direction == "min" else value <= limit)
        text = f"{name} {value or 0:.3g} ({th.direction} {limit:g})"
    return _check(variant, name, value, limit, ok, text)


def run_checks(ledger: Ledger, run_id: str | None, spec: GateSpec) -> tuple[str, list[Check]]:
    """Every check of a gate on one run. Thresholds and targets read each variant's first load
    level (the report's rows); margins compare the variants level by level, so a sweep's gate never
    sets one variant's high level against another's low one. With no margins given, the matrix's
    own `margins:` are checked."""
    run = ledger.require_run(run_id)
    rid = run["id"]
    use_run(run)  # its graders' margins parse like a built-in's
    if not spec.margins:
        spec = replace(spec, margins=parse_margins(run.margins, "matrix margins"))
    if spec.empty():  # before any row is read: a usage error costs nothing
        raise UsageError("check: give at least one threshold (e.g. --threshold schema_pass=0.9, --margins "
                         "drift=0.05, --target ttft_p99=2000, --max-error-rate 0), or margins in the matrix")
    rep = build_report(ledger, rid)  # a slice at a time, as `report` builds it: the run's rows are never held
    base = rep["baseline"]
    rows = {r["variant"]: r for r in rep["rows"] if r["complexity"] == "all"}
    # the percentile targets over each variant's cases at its first level, as the report's tables count them
    targets = ledger.slice_table(rid, base, ledger.require_run(rid).repeats,
                                 [Metric(f"{m}:p{q:g}", "", source=m, agg=f"p{q:g}") for m, q in spec.targets],
                                 {}) if spec.targets else {}
    known = registry_thresholds()
    out: list[Check] = []
    for v, r in rows.items():
        if spec.max_error_rate is not None:
            rate = r["n_errors"] / r["n"] if r["n"] else None
            out.append(_check(v, "error rate", rate, spec.max_error_rate,
                              rate is not None and rate <= spec.max_error_rate,
                              f"error rate {rate or 0:.1%} (max {spec.max_error_rate:.1%})"))
        for name, limit in spec.thresholds.items():
            th = known[name][1]
            if th.candidates_only and v == base:
                continue
            out.append(threshold_check(v, r, name, th, limit))
        for (metric, q), limit in spec.targets.items():
            est = targets.get((v, "all"), {}).get(f"{metric}:p{q:g}")
            label = f"{metric.removesuffix('_ms')} p{q:g}"
            out.append(_check(v, label, est, limit, None if est is None else est <= limit,
                              f"{label} {est or 0:,.0f} ms (max {limit:,.0f} ms)"))
    if spec.max_client_lag_ms is not None:
        lag = ledger.client_lag_p99(rid)
        for v in rows:
            p99, kernel = lag.get(v, (None, True))
            out.append(_check(v, "client lag", p99, spec.max_client_lag_ms,
                              None if p99 is None else p99 <= spec.max_client_lag_ms,
                              f"client event-loop lag p99 {p99 or 0:,.1f} ms over its requests (max "
                              f"{spec.max_client_lag_ms:g} ms; {'kernel' if kernel else 'user-space'} stamps)"))
    # a sweep's levels share one Holm family per variant: four levels are not four chances to be wrong
    time = timeshare(ledger, rid, base, spec.margins) if base else None
    swept, vs = ledger_verdicts(ledger, rid, base, spec.margins, time)
    for e in vs:
        out.append(margin_check(e, swept, spec.require_decided))
    return rid, out


def margin_check(e: dict[str, Any], swept: bool, require_decided: bool) -> Check:
    """One verdict as a check: inferior fails; inconclusive is undecided (a failure with
    ``require_decided``); the line says the statistic, pairs and failures, and when the run was
    too small for any verdict."""
    at = f" at c={e['level']}" if swept else ""
    decided = e["verdict"] not in ("inconclusive", "undecided")  # undecided: the machine moved under it
    small = (f"; this run is too small to decide: {e['pairs']} pairs, at least {e['need_pairs']} needed"
             if e["pairs"] < e["need_pairs"] and "cannot decide" not in e["why"] else "")
    return Check(e["variant"], f"margin {e['metric']}{at}", e["estimate"], e["margin"],
                 e["verdict"] != "inferior" and (decided or not require_decided),
                 f"{e['metric']}{at}: {e['verdict']} ({fmt_estimate(e)} at {level_text(e['ci_level'])}, margin "
                 f"{e['margin_text']}; {e['statistic']}; {counts_text(e)}; {e['why']}{small})", decided)


def junit_xml(run_id: str, checks: list[Check]) -> str:
    fails = sum(not c.passed for c in checks)
    cases = []
    for c in checks:
        body = "" if c.passed else f"<failure message={quoteattr(c.message)}>{escape(c.message)}</failure>"
        cases.append(f'  <testcase classname={quoteattr("evalkit." + c.variant)} name={quoteattr(c.name)}>'
                     f"{body}</testcase>")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name={quoteattr("evalkit check " + run_id)} '
            f'tests="{len(checks)}" failures="{fails}" errors="0">\n' + "\n".join(cases) + "\n</testsuite>\n")


def summary_line(checks: list[Check]) -> str:
    """'3 passed, 0 failed, 1 undecided': a margin the run could not decide is never counted as passed."""
    passed = sum(c.passed and c.decided for c in checks)
    failed = sum(not c.passed for c in checks)
    undecided = sum(c.passed and not c.decided for c in checks)
    tail = (f", {undecided} undecided (inconclusive: not failed; --require-decided fails them)"
            if undecided else "")
    return f"{passed} passed, {failed} failed" + tail


def write_junit(path: Path, run_id: str, checks: list[Check]) -> None:
    """The checks as JUnit XML, written whole or not at all."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(junit_xml(run_id, checks), encoding="utf-8")
    tmp.replace(path)
