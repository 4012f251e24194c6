"""Datasette's canned queries over the ledger (SQL lives in the ledger package, like all SQL)."""

CANNED = {
    "study_summary": {
        "title": "The study's summary",
        "description": "TTFT tax by complexity, E2E delta on medium generations, KV-cache, preemptions, quality",
        "sql": "select run_id, variant, json_extract(json, '$.n') as n, json_extract(json, '$.errors') as errors, "
               "round(json_extract(json, '$.ttft_tax_short_pct'), 1) as ttft_tax_short_pct, "
               "round(json_extract(json, '$.ttft_tax_medium_pct'), 1) as ttft_tax_medium_pct, "
               "round(json_extract(json, '$.ttft_tax_long_pct'), 1) as ttft_tax_long_pct, "
               "round(json_extract(json, '$.e2e_delta_medium_pct'), 1) as e2e_delta_medium_pct, "
               "round(json_extract(json, '$.kv_cache_peak_pct'), 1) as kv_peak_pct, "
               "json_extract(json, '$.preemptions') as preemptions, "
               "round(json_extract(json, '$.schema_pass_pct'), 1) as schema_pass_pct, "
               "round(json_extract(json, '$.formality_mae'), 2) as formality_mae from derived_summary",
    },
    "cost": {"title": "Cost per token vs the reference price",
             "sql": "select run_id, variant, phase, concurrency, meets_slo, round(output_tps, 1) as output_tps, "
                    "usd_per_hour, round(usd_per_m_output_tokens, 2) as usd_per_m_output_tokens, "
                    "round(usd_per_1k_requests, 3) as usd_per_1k_requests, reference, "
                    "round(reference_usd_per_1k_requests, 3) as reference_usd_per_1k_requests, "
                    "round(break_even_requests_per_hour) as break_even_requests_per_hour, best_level "
                    "from derived_cost order by run_id, variant, concurrency"},
    "spikes": {"title": "Latency spikes and their causes",
               "sql": "select run_id, variant, complexity, case_id, round(value) as ttft_ms, round(slice_median) "
                      "as slice_median_ms, round(robust_z, 1) as robust_z, cause, evidence, request_id "
                      "from derived_spikes order by robust_z desc"},
    "worst_drift": {"title": "Largest drift from the baseline",
                    "sql": "select run_id, variant, case_id, complexity, round(1 - drift_cosine, 4) as drift, text "
                           "from requests_joined where drift_cosine is not null and drift_cosine < 1 "
                           "order by drift_cosine asc limit 50"},
    "schema_failures": {"title": "Outputs that failed their JSON Schema",
                        "sql": "select r.run_id, r.variant, r.case_id, g.explanation, r.finish_reason, r.text "
                               "from grades g join requests r on r.id = g.request_id "
                               "where g.grader = 'schema' and g.passed = 0 order by g.id desc limit 200"},
    "failures": {"title": "Failed requests",
                 "sql": "select run_id, variant, case_id, error_class, http_status, error from requests "
                        "where error_class is not null order by id desc"},
}
