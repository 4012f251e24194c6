"""Datasette's canned queries over the ledger (SQL lives in the ledger package, like all SQL).
The queries about grades are built from what each registered grader declares (a shape, never
SQL), so a plugin grader gets its canned queries like the built-ins do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

FIXED: dict[str, dict[str, str]] = {
    "cost": {"title": "Cost per token vs the reference price",
             "sql": "select run_id, variant, level, concurrency, meets_slo, round(output_tps, 1) as output_tps, "
                    "usd_per_hour, round(usd_per_m_output_tokens, 2) as usd_per_m_output_tokens, "
                    "round(usd_per_1k_requests, 3) as usd_per_1k_requests, reference, "
                    "round(reference_usd_per_1k_requests, 3) as reference_usd_per_1k_requests, "
                    "round(break_even_requests_per_hour) as break_even_requests_per_hour, best_level "
                    "from derived_cost order by run_id, variant, concurrency"},
    "spikes": {"title": "Latency spikes and their causes",
               "sql": "select run_id, variant, complexity, case_id, round(value) as ttft_ms, round(slice_median) "
                      "as slice_median_ms, round(robust_z, 1) as robust_z, cause, evidence, request_id "
                      "from derived_spikes order by robust_z desc"},
    "failures": {"title": "Failed requests",
                 "sql": "select run_id, variant, case_id, attempt, final, error_class, http_status, error from requests "
                        "where error_class is not null order by id desc"},
    "capacity": {"title": "Capacity per variant: KV blocks under the run's memory budget, and where the SLO held",
                 "sql": "select run_id, name as variant, weight_bytes, kv_bytes, kv_blocks, kv_block_size, kv_tokens, "
                        "max_concurrency_predicted, status from variants order by run_id, rowid"},
    "verdicts": {"title": "Non-inferiority verdicts per variant and metric",
                 "sql": "select run_id, variant, concurrency, metric, margin, unit, pairs, estimate, ci_low, ci_high, "
                        "ci_level, verdict, why from derived_verdicts order by run_id, variant, concurrency, metric"},
    "client_lag": {"title": "The client's own event-loop lag over each run (was the client the bottleneck?)",
                   "sql": "select run_id, round(max(lag_ms), 1) as max_lag_ms, count(*) as samples, "
                          "sum(lag_ms > 10) as samples_over_10ms from client_lag group by run_id"},
}


def _ident(s: str) -> bool:
    return s.replace("-", "_").isidentifier()


def grader_query(grader: str, name: str, title: str, kind: str, column: str | None,
                 field: str = "value") -> dict[str, str] | None:
    """SQL for one grader-declared canned query shape (None for a shape or name it cannot take).
    ``column``: the grader's `requests_joined` column, ``field`` the grade's field it shows."""
    if not _ident(grader) or not _ident(name):
        return None
    if kind == "failures":
        return {"title": title, "sql": "select r.run_id, r.variant, r.case_id, g.explanation, r.finish_reason, r.text "
                                       "from grades g join requests r on r.id = g.request_id "
                                       f"where g.grader = '{grader}' and g.passed = 0 order by g.id desc limit 200"}
    if kind in ("lowest", "highest") and column and column.isidentifier() and field in ("value", "passed"):
        order = "asc" if kind == "lowest" else "desc"
        # The rows of `requests_joined` (a request's newest grade), read from the grades' (grader,
        # field) index in order: the view would grade-join every request before sorting them.
        return {"title": title, "sql": f"select r.run_id, r.variant, r.case_id, c.complexity, g.{field} as {column}, "
                                       "r.text from grades g join requests r on r.id = g.request_id "
                                       "join runs u on u.id = r.run_id left join cases c on c.id = r.case_id "
                                       f"and c.dataset_hash = u.dataset_hash where g.grader = '{grader}' "
                                       f"and g.{field} is not null and r.is_warmup = 0 and not exists (select 1 from "
                                       "grades n where n.request_id = g.request_id and n.grader = g.grader "
                                       f"and n.id > g.id) order by g.{field} {order}, g.id {order} limit 50"}
    return None


def study_summary_query(headline: Iterable[tuple[str, int | None]]) -> dict[str, str]:
    """The study's summary, with one column per grader headline (key, digits)."""
    cols = "".join(f"round(json_extract(json, '$.{k}'), {d or 0}) as {k}, " for k, d in headline if k.isidentifier())
    return {
        "title": "The study's summary",
        "description": "TTFT tax by complexity, E2E delta on medium generations, KV-cache, preemptions, quality",
        "sql": "select run_id, variant, json_extract(json, '$.n') as n, json_extract(json, '$.errors') as errors, "
               "round(json_extract(json, '$.ttft_tax_short_pct'), 1) as ttft_tax_short_pct, "
               "round(json_extract(json, '$.ttft_tax_medium_pct'), 1) as ttft_tax_medium_pct, "
               "round(json_extract(json, '$.ttft_tax_long_pct'), 1) as ttft_tax_long_pct, "
               "round(json_extract(json, '$.e2e_delta_medium_pct'), 1) as e2e_delta_medium_pct, "
               "round(json_extract(json, '$.kv_cache_peak_pct'), 1) as kv_peak_pct, "
               f"json_extract(json, '$.preemptions') as preemptions, {cols}"
               "json_extract(json, '$.verdict') as verdict from derived_summary",
    }


def canned(grader_queries: Iterable[tuple[str, str, str, str, str | None, str]],
           headline: Iterable[tuple[str, int | None]]) -> dict[str, Any]:
    """Every canned query: the fixed ones, the study summary and each grader's."""
    out: dict[str, Any] = {"study_summary": study_summary_query(headline), **FIXED}
    for grader, name, title, kind, column, field in grader_queries:
        q = grader_query(grader, name, title, kind, column, field)
        if q and name not in out:
            out[name] = q
    return out
