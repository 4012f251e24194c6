"""A gate for pipelines: thresholds on a run, one line per failure, JUnit XML for CI systems, so
a model or engine upgrade can be gated the way prompt changes are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from .errors import UsageError
from .findings import request_rows
from .ledger import Ledger
from .report import build_report
from .stats import percentile


@dataclass
class Check:
    variant: str
    name: str
    value: float | None
    limit: float
    passed: bool
    message: str


@dataclass
class Thresholds:
    max_drift_above_floor: float | None = None  # fails when drift − floor is above this (CI low > limit)
    min_schema: float | None = None  # schema pass rate, 0-1
    max_formality_mae: float | None = None
    max_error_rate: float | None = None  # failed requests / requests, 0-1
    slo: dict[tuple[str, float], float] | None = None  # (metric, percentile) -> ms

    def empty(self) -> bool:
        return all(v is None for v in (self.max_drift_above_floor, self.min_schema, self.max_formality_mae,
                                       self.max_error_rate)) and not self.slo


def _check(variant: str, name: str, value: float | None, limit: float, ok: bool | None, text: str) -> Check:
    if value is None or ok is None:
        return Check(variant, name, value, limit, False, f"{name}: no data to check ({text})")
    return Check(variant, name, value, limit, ok, text)


def run_checks(ledger: Ledger, run_id: str | None, t: Thresholds) -> tuple[str, list[Check]]:
    if t.empty():
        raise UsageError("check: give at least one threshold (e.g. --min-schema 0.9, --max-drift-above-floor 0)")
    rep = build_report(ledger, run_id)
    rid = rep["run"]["id"]
    base = rep["baseline"]
    rows = {r["variant"]: r for r in rep["rows"] if r["complexity"] == "all"}
    reqs = request_rows(ledger, rid) if t.slo else []
    out: list[Check] = []
    for v, r in rows.items():
        if t.max_error_rate is not None:
            rate = r["n_errors"] / r["n"] if r["n"] else None
            out.append(_check(v, "error rate", rate, t.max_error_rate, rate is not None and rate <= t.max_error_rate,
                              f"error rate {rate or 0:.1%} (max {t.max_error_rate:.1%})"))
        if t.min_schema is not None:
            s = r.get("schema_pass_pct")
            out.append(_check(v, "schema", None if s is None else s / 100, t.min_schema,
                              None if s is None else s / 100 >= t.min_schema,
                              f"schema pass {0 if s is None else s:.1f} % (min {100 * t.min_schema:.1f} %)"))
        if t.max_formality_mae is not None:
            m = r.get("formality_mae")
            out.append(_check(v, "formality MAE", m, t.max_formality_mae, None if m is None else m <= t.max_formality_mae,
                              f"formality MAE {m or 0:.2f} (max {t.max_formality_mae:.2f})"))
        if t.max_drift_above_floor is not None and v != base:
            ci = r.get("drift_minus_floor_ci95")
            d = r.get("drift_minus_floor")
            ok = None if ci is None else ci[0] <= t.max_drift_above_floor
            out.append(_check(v, "drift above floor", d, t.max_drift_above_floor, ok,
                              f"drift − floor {d or 0:+.3f}, 95 % CI [{ci[0]:+.3f}, {ci[1]:+.3f}] (fails when the "
                              f"interval lies above {t.max_drift_above_floor:+.3f})" if ci else "too few pairs"))
        for (metric, q), limit in (t.slo or {}).items():
            xs = [x[metric] for x in reqs if x["variant"] == v and x["error_class"] is None and x[metric] is not None]
            est = percentile(xs, q)
            label = f"{metric.removesuffix('_ms')} p{q:g}"
            out.append(_check(v, label, est, limit, None if est is None else est <= limit,
                              f"{label} {est or 0:,.0f} ms (max {limit:,.0f} ms)"))
    return rid, out


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
    return f"{sum(c.passed for c in checks)} passed, {sum(not c.passed for c in checks)} failed"


def as_dicts(checks: list[Check]) -> list[dict[str, Any]]:
    return [c.__dict__ for c in checks]
