"""Ledger schema as numbered migrations. Names are permanent: add new ones, never rename."""

from __future__ import annotations

from collections.abc import Callable

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from .views import APPENDED, COPIED, VIEWS, requests_view_sql

MIGRATION_SET = "evalkit"
migrations = Migrations(MIGRATION_SET)
MIGRATION_NAMES: list[str] = []  # every migration this evalkit knows, in order


def migration(name: str) -> Callable[[Callable[[Database], None]], Callable[[Database], None]]:
    MIGRATION_NAMES.append(name)
    return migrations(name=name)


@migration("m001_initial")
def m001_initial(db: Database) -> None:
    db["runs"].create(
        {
            "id": str, "created_at": str, "finished_at": str, "status": str,
            "matrix_name": str, "matrix_json": str, "dataset_path": str, "dataset_hash": str,
            "n_cases": int, "case_ids_json": str, "seed": int, "evalkit_version": str,
            "python_version": str, "host": str, "platform": str, "argv": str,
        },
        pk="id",
    )
    db["variants"].create(
        {
            "id": str, "run_id": str, "name": str, "is_baseline": int, "model": str,
            "model_path": str, "engine": str, "engine_version": str, "server_args_json": str,
            "endpoint_url": str, "served_model_name": str, "status": str, "error": str,
            "started_at": str, "ready_s": float, "stopped_at": str, "log_tail": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["cases"].create(
        {
            "id": str, "dataset_hash": str, "task": str, "persona": str, "candidate": str,
            "complexity": str, "formality": int, "schema_name": str, "context_keys_json": str,
            "messages_json": str,
        },
        pk=("dataset_hash", "id"),
    )
    db["requests"].create(
        {
            "id": int, "run_id": str, "variant": str, "case_id": str, "repeat": int, "seq": int,
            "is_warmup": int, "started_at": str, "ttft_ms": float, "e2e_ms": float,
            "itl_mean_ms": float, "tpot_ms": float, "prompt_tokens": int,
            "completion_tokens": int, "usage_source": str, "finish_reason": str, "text": str,
            "n_chunks": int, "chunk_offsets_ms_json": str, "http_status": int,
            "error_class": str, "error": str, "request_json": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["requests"].create_index(["run_id", "variant", "case_id", "repeat"])
    db["grades"].create(
        {
            "id": int, "request_id": int, "run_id": str, "grader": str, "grader_version": str,
            "value": float, "passed": int, "explanation": str, "detail_json": str,
            "created_at": str,
        },
        pk="id",
        foreign_keys=[("request_id", "requests", "id"), ("run_id", "runs", "id")],
    )
    db["grades"].create_index(["run_id", "grader"])
    db["grades"].create_index(["request_id"])


@migration("m002_server_telemetry")
def m002_server_telemetry(db: Database) -> None:
    db["server_metrics"].create(
        {"id": int, "run_id": str, "variant": str, "mono_ms": float, "ts": str, "series": str, "value": float},
        pk="id",
    )
    db["server_metrics"].create_index(["run_id", "variant", "series", "mono_ms"])
    for col, typ in [
        ("phase", str), ("concurrency", int), ("attempt", int), ("final", int), ("mono_start_ms", float),
        ("first_chunk_ms", float), ("n_malformed", int),
        ("srv_method", str), ("srv_queue_ms", float), ("srv_prefill_ms", float), ("srv_decode_ms", float),
        ("srv_inference_ms", float), ("srv_ttft_ms", float), ("srv_e2e_ms", float),
        ("srv_kv_cache_usage_start", float), ("srv_running_start", float), ("srv_waiting_start", float),
        ("srv_kv_cache_usage_peak", float), ("srv_preemptions", float), ("srv_prompt_tokens", float),
        ("srv_prefix_cache_hits", float),
    ]:
        db["requests"].add_column(col, typ)
    db.execute("update requests set attempt = 0, final = 1, phase = 'main', concurrency = 1")
    for col in ("cache_config_json", "models_json", "quantization", "metrics_available"):
        db["variants"].add_column(col, str)
    db["runs"].add_column("load_json", str)


@migration("m003_case_persona_text")
def m003_case_persona_text(db: Database) -> None:
    # graders need the persona's words (similarity signal), not only its id
    db["cases"].add_column("persona_title", str)
    db["cases"].add_column("persona_description", str)


@migration("m004_browse_views")
def m004_browse_views(db: Database) -> None:
    # One row per request with its case and newest grades: what Datasette facets and queries use.
    db.execute("""
        create view if not exists requests_joined as
        select r.id, r.run_id, r.variant, c.task, c.persona, c.complexity, c.formality, r.case_id, r.repeat,
               r.phase, r.concurrency, r.is_warmup, r.final, r.started_at, r.ttft_ms, r.tpot_ms, r.itl_mean_ms,
               r.e2e_ms, r.prompt_tokens, r.completion_tokens, r.finish_reason, r.error_class,
               r.srv_queue_ms, r.srv_prefill_ms, r.srv_decode_ms, r.srv_kv_cache_usage_peak, r.srv_preemptions,
               (select passed from grades g where g.request_id = r.id and g.grader = 'schema' order by g.id desc limit 1)
                   as schema_passed,
               (select value from grades g where g.request_id = r.id and g.grader = 'persona' order by g.id desc limit 1)
                   as persona_score,
               (select value from grades g where g.request_id = r.id and g.grader = 'formality' order by g.id desc limit 1)
                   as formality_predicted,
               (select value from grades g where g.request_id = r.id and g.grader = 'drift' order by g.id desc limit 1)
                   as drift_cosine,
               r.text
        from requests r join runs u on u.id = r.run_id
        left join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
    """)
    # Findings that need Python (robust statistics), refreshed by `evalkit report` / `browse`.
    db["derived_spikes"].create({"run_id": str, "request_id": int, "variant": str, "complexity": str,
                                 "case_id": str, "metric": str, "value": float, "slice_median": float,
                                 "robust_z": float, "cause": str, "evidence": str, "line": str})
    db["derived_summary"].create({"run_id": str, "variant": str, "json": str})


BUILT_IN_VIEW_COLUMNS = [("schema_passed", "schema", "passed"), ("persona_score", "persona", "value"),
                         ("formality_predicted", "formality", "value"), ("drift_cosine", "drift", "value")]


@migration("m005_hosts_load_cost")
def m005_hosts_load_cost(db: Database) -> None:
    # The machine is part of the result: one row per distinct host description.
    db["hosts"].create({
        "id": str, "hostname": str, "cpu_model": str, "cpu_vendor": str, "cores": int, "threads": int,
        "memory_gib": float, "isa_json": str, "cpu_class": str, "gpu_json": str, "os": str,
        "python_version": str, "torch_version": str, "vllm_version": str, "evalkit_version": str,
    }, pk="id")
    db["runs"].add_column("host_id", str)
    # Recorded per variant: the dtype it was served in, and why (a fact, not part of the name).
    for col in ("dtype", "dtype_reason", "cost_json", "replicas_json"):
        db["variants"].add_column(col, str)
    # Open-loop load: when the request was due, when it was sent, how long a cap held it back.
    for col, typ in (("replica", int), ("scheduled_ms", float), ("sent_ms", float), ("client_wait_ms", float),
                     ("ttft_from_schedule_ms", float)):
        db["requests"].add_column(col, typ)
    db.execute("drop view if exists requests_joined")
    db.execute(requests_view_sql(BUILT_IN_VIEW_COLUMNS, level="phase"))


@migration("m006_derived_cost")
def m006_derived_cost(db: Database) -> None:
    # $ per million output tokens / per 1k requests per load level, refreshed by `browse`
    db["derived_cost"].create({"run_id": str, "variant": str, "phase": str, "concurrency": int, "meets_slo": int,
                               "output_tps": float, "usd_per_hour": float, "usd_per_m_output_tokens": float,
                               "usd_per_1k_requests": float, "reference": str, "reference_usd_per_1k_requests": float,
                               "break_even_requests_per_hour": float, "best_level": int})


@migration("m007_replicas")
def m007_replicas(db: Database) -> None:
    # One row per server of a replicated variant (or per Ray worker); server series say whose.
    db["replicas"].create({"id": str, "run_id": str, "variant": str, "replica": int, "endpoint_url": str,
                           "model_path": str, "node": str, "status": str, "error": str, "ready_s": float,
                           "started_at": str, "stopped_at": str, "log_tail": str}, pk="id")
    db["server_metrics"].add_column("replica", int)
    db["variants"].add_column("node", str)
    db["variants"].add_column("host_id", str)  # the machine that served it, when not the driver's (Ray)


@migration("m008_scrape_coverage")
def m008_scrape_coverage(db: Database) -> None:
    # The KV peak is a sampled gauge: how many /metrics samples fell inside each request, and how
    # many scrapes of a variant's server failed, so a thin or broken time series shows.
    db["requests"].add_column("srv_scrapes", int)
    db["variants"].add_column("scrape_errors", int)
    db["variants"].add_column("scrape_last_error", str)
    db["replicas"].add_column("scrape_errors", int)
    db["replicas"].add_column("scrape_last_error", str)


@migration("m009_server_samples")
def m009_server_samples(db: Database) -> None:
    # "metrics" meant three things; the scraped /metrics time series is `server_samples` now. The
    # old name stays as a read-only view for one release (CHANGELOG.md).
    db.execute("alter table server_metrics rename to server_samples")
    db.execute("create view server_metrics as select * from server_samples")


@migration("m010_capacity_and_response_timing")
def m010_capacity_and_response_timing(db: Database) -> None:
    # One memory budget for every variant: what it bought, planned and as the engine made it.
    for col, typ in (("memory_budget_bytes", int), ("weight_bytes", int), ("weight_bytes_reported", int),
                     ("kv_bytes", int), ("kv_block_size", int), ("kv_blocks", int), ("kv_blocks_planned", int),
                     ("kv_tokens", int),
                     ("max_concurrency_predicted", int), ("tokens_per_request", float),
                     ("saturated_at", int), ("saturation_reason", str)):
        db["variants"].add_column(col, typ)
    # vLLM's own timing of each request (--enable-per-request-metrics, the final chunk's `metrics`),
    # next to what the /metrics join gave for the same request, and the load around it.
    for col, typ in (("srv_resp_ttft_ms", float), ("srv_resp_queue_ms", float), ("srv_resp_generation_ms", float),
                     ("srv_resp_mean_itl_ms", float), ("srv_resp_tokens_per_s", float),
                     ("srv_hist_ttft_ms", float), ("srv_hist_queue_ms", float),
                     ("srv_waiting_peak", float), ("srv_running_peak", float)):
        db["requests"].add_column(col, typ)


@migration("m011_client_clock")
def m011_client_clock(db: Database) -> None:
    # Timing the client's own load cannot bend: which clock stamped each request's reads (the
    # kernel's receive time, or user space), the user-space first-token time beside it, how many
    # SSE events the first token's read held, and whether the client's loop lagged over the request.
    for col, typ in (("timestamp_source", str), ("ttft_user_ms", float), ("n_reads", int),
                     ("first_read_chunks", int), ("max_read_chunks", int), ("client_lag_max_ms", float),
                     ("timing_suspect", int), ("client_proc", int)):
        db["requests"].add_column(col, typ)
    # the client's event-loop lag, sampled through the run (one row per window: its worst lateness)
    db["client_lag"].create({"id": int, "run_id": str, "proc": int, "phase": str, "mono_ms": float,
                             "lag_ms": float}, pk="id")
    db["client_lag"].create_index(["run_id", "mono_ms"])


@migration("m012_faults")
def m012_faults(db: Database) -> None:
    # Statuses that tell the truth: which process ran a run (a `running` run whose process is gone
    # is stale), why it stopped, and how a launched server ended.
    db["runs"].add_column("pid", int)
    db["runs"].add_column("stop_reason", str)
    db["variants"].add_column("exit_code", int)
    db["variants"].add_column("server_pid", int)
    db["replicas"].add_column("exit_code", int)
    db["replicas"].add_column("server_pid", int)


@migration("m013_traffic")
def m013_traffic(db: Database) -> None:
    # Traffic like production: conversations (one row per turn, the variant's own replies in the
    # history), trace replay (the trace row each request came from, what it asked for), shared
    # prefixes (what the workload shares by design, what the server's prefix cache served), and
    # other tools' results imported into the ledger (`source`).
    for col, typ in (("conversation_id", str), ("turn", int), ("trace_row", int), ("trace_input_tokens", int),
                     ("trace_output_tokens", int), ("designed_shared_tokens", int), ("cached_prompt_tokens", int)):
        db["requests"].add_column(col, typ)
    db["runs"].add_column("source", str)
    db["runs"].add_column("trace_json", str)


@migration("m014_verdicts_and_clocks")
def m014_verdicts_and_clocks(db: Database) -> None:
    # E2E ends at the receive time of the read that ended the stream (the clock TTFT uses); the
    # moment the event loop got round to it stays beside it.
    db["requests"].add_column("e2e_user_ms", float)
    # The verdicts, one row per variant, load level and margin, for Datasette's canned query: it
    # exists on every ledger, empty for runs without margins.
    db["derived_verdicts"].create({"run_id": str, "variant": str, "concurrency": int, "metric": str, "margin": float,
                                   "unit": str, "pairs": int, "estimate": float, "ci_low": float, "ci_high": float,
                                   "ci_level": float, "p_margin": float, "p_margin_holm": float, "verdict": str,
                                   "why": str, "method": str})


@migration("m015_one_meaning_per_name")
def m015_one_meaning_per_name(db: Database) -> None:
    # "phase" meant a load level and the server's queue/prefill/decode: a load level is `level`.
    # vLLM's per-request time_to_first_token_ms runs from scheduling to the first token: the prefill.
    db.execute("drop view if exists requests_joined")
    db.execute("alter table requests rename column phase to level")
    db.execute("alter table requests rename column srv_resp_ttft_ms to srv_resp_prefill_ms")
    db.execute("alter table client_lag rename column phase to level")
    db.execute("alter table derived_cost rename column phase to level")
    db.execute(requests_view_sql(BUILT_IN_VIEW_COLUMNS))  # every registered grader's come with the next grading
    db.execute("drop view if exists server_metrics")  # the 0.1 name of server_samples, kept for one release


@migration("m016_generic_cases")
def m016_generic_cases(db: Database) -> None:
    # A case of any workload: its attributes (every field beyond id and messages), an expected
    # answer, and the JSON Schema it named, resolved (a name, a path or inline). The resume
    # workload's own columns stay, filled from its attributes, for Datasette's facets.
    db["cases"].add_column("attributes_json", str)
    db["cases"].add_column("reference", str)
    db["cases"].add_column("schema_json", str)
    # Which graders a run chose (the matrix's, or the defaults that applied) and the workload folder
    # their `module:Class` names are imported from.
    db["runs"].add_column("graders_json", str)
    db["runs"].add_column("workload_dir", str)


@migration("m017_browse_at_scale")
def m017_browse_at_scale(db: Database) -> None:
    # Datasette's facets group requests by these, and the failures query filters on one: with an
    # index each they answer from the index, well under a second at a million rows.
    for cols in (["variant"], ["error_class"], ["finish_reason"], ["is_warmup"]):
        db["requests"].create_index(cols, if_not_exists=True)
    db["grades"].create_index(["grader", "passed"], if_not_exists=True)
    # Which runs' derived tables are current: a run's are recomputed only when its rows, grades or
    # status changed since (its signature), never at every `browse`.
    db["derived_runs"].create({"run_id": str, "signature": str, "computed_at": str}, pk="run_id")


@migration("m018_token_scores")
def m018_token_scores(db: Database) -> None:
    # Teacher-forced scoring (the divergence grader, issue 26): one row per scoring request, never a
    # `requests` row, so it never enters latency statistics. A server scores the baseline's answer
    # to a case (`answer_request_id`) given the case's messages; `kind` says which pass: the
    # baseline alone (`reference`), the baseline batched (`floor`: what batching alone changes), a
    # candidate (`candidate`), a greedy regeneration of the baseline's answer batched (`regen`), a
    # first request that pays one-off costs (`warmup`). Per answer token, `tokens_json` keeps the
    # forced token (id, text, log-probability) and the server's top-k (ids, log-probabilities);
    # `temperature` is the run's, which says whether greedy identity applies.
    db["token_scores"].create({
        "id": int, "run_id": str, "variant": str, "replica": int, "case_id": str, "answer_request_id": int,
        "answer_variant": str, "kind": str, "status": str, "error_class": str, "error": str, "http_status": int,
        "started_at": str, "mono_start_ms": float, "e2e_ms": float, "concurrency": int, "top_k": int,
        "prompt_tokens": int, "prefix_tokens": int, "answer_tokens": int, "usage_json": str, "server_timing_json": str,
        "temperature": float, "text": str, "finish_reason": str, "request_json": str, "tokens_json": str,
    }, pk="id", foreign_keys=[("run_id", "runs", "id")])
    db["token_scores"].create_index(["run_id", "variant", "kind"])


@migration("m019_grade_sample")
def m019_grade_sample(db: Database) -> None:
    # A run graded on a stratified sample (`--grade-sample N`) says so: per slice, the cases seen
    # and kept (grading/sample.py); null when every successful request was graded.
    db["runs"].add_column("grade_sample_json", str)


@migration("m020_grade_errors")
def m020_grade_errors(db: Database) -> None:
    # A grader that raised on a request leaves a row saying so (its exception's class and message),
    # value and pass empty: the request is accounted for, never silently ungraded, and
    # `evalkit grade --retry-failed` grades exactly those again. Reports read only grades without one.
    db["grades"].add_column("error_class", str)
    db["grades"].add_column("error", str)


@migration("m021_reviews")
def m021_reviews(db: Database) -> None:
    # Human review of a baseline/candidate pair (`evalkit browse --review`, issue 35): one row per
    # submission, never updated (a reviewer who changes their mind adds a row; the newest counts).
    # The request ids name exactly which two answers were read.
    db["reviews"].create({
        "id": int, "run_id": str, "case_id": str, "baseline": str, "candidate": str, "baseline_request_id": int,
        "candidate_request_id": int, "reviewer": str, "verdict": str, "comment": str, "created_at": str,
    }, pk="id", foreign_keys=[("run_id", "runs", "id")])
    db["reviews"].create_index(["run_id", "candidate", "case_id"])


@migration("m022_report_reads")
def m022_report_reads(db: Database) -> None:
    # A report reads a run an ordered stretch of seqs at a time (`Ledger.seq_ranges`) and each
    # stretch's grades through its requests: without this index every stretch scanned the run.
    db["requests"].create_index(["run_id", "seq"], if_not_exists=True)


@migration("m023_env_samples")
def m023_env_samples(db: Database) -> None:
    # The machine's load while a run measured (issue 47, measure/envload.py): one row about once a
    # second, on the run's perf_counter clock (`t_ms`, like requests.mono_start_ms; `span_ms`: the
    # interval the row's CPU figures cover, ending at t_ms), so each variant's requests join to
    # the load they ran under. Cores for the CPU figures, shares of all CPU time for steal/iowait.
    db["env_samples"].create({
        "id": int, "run_id": str, "t_ms": float, "span_ms": float, "ts": str, "variant_active": str,
        "foreign_cpu": float, "own_cpu": float, "server_cpu": float, "busy_cpu": float, "steal": float,
        "iowait": float, "load1": float, "cpu_mhz": float, "mem_pressure": float, "mem_available_mb": float,
        "gpu_sm_clock_ratio": float, "gpu_throttle": int, "gpu_temp_c": float, "gpu_power_w": float,
        "gpu_foreign_procs": int,
    }, pk="id", foreign_keys=[("run_id", "runs", "id")])
    db["env_samples"].create_index(["run_id", "t_ms"])


@migration("m024_order")
def m024_order(db: Database) -> None:
    # The variants alternate (issue 47, execution/order.py): each request records its group of the
    # alternation (a case on a sequential level, a chunk of cases on a loaded one) and its place in
    # it, so a position effect can be estimated and a verdict knows its sides ran side by side.
    # A run that switches one server at a time (`--order blocks`) records each switch and its time.
    db["requests"].add_column("order_block", int)
    db["requests"].add_column("order_position", int)
    db["switches"].create({
        "id": int, "run_id": str, "variant": str, "block": int, "position": int, "kind": str, "t_ms": float,
        "took_s": float, "ts": str,
    }, pk="id", foreign_keys=[("run_id", "runs", "id")])
    db["switches"].create_index(["run_id", "variant"])


@migration("m025_reasoning")
def m025_reasoning(db: Database) -> None:
    # A reasoning model streams its thinking apart from its answer (issue 49): TTFT is the first token
    # of any kind, TTFO the first answer token, and the reasoning's own time, tokens and text are kept
    # beside the answer (graders read the answer; `text` stays the answer alone).
    for col, kind in (("ttfo_ms", float), ("reasoning_ms", float), ("reasoning_tokens", int), ("reasoning_text", str)):
        db["requests"].add_column(col, kind)


@migration("m026_env_cpus")
def m026_env_cpus(db: Database) -> None:
    # How many CPUs a load sample measured (issue 47): the ones evalkit and the servers may run on,
    # when pinned to fewer than /proc/stat shows; the foreign-CPU bar is sized by them.
    db["env_samples"].add_column("cpus", int)


@migration("m027_measured_views")
def m027_measured_views(db: Database) -> None:
    # What is measured, defined once (issue 48): every read of measured rows and newest grades
    # goes through these two views (SQLite inlines them: the requests' indexes still serve). load_level:
    # the level as the report counts it (`reporting.selection.level_of`: the concurrency, 1 when none).
    for name, sql in VIEWS.items():
        db.execute(f"create view {name} as {sql}")


@migration("m028_change_tag")
def m028_change_tag(db: Database) -> None:
    # When the rows the columnar copy holds changed, by any writer (issue 48, ledger/columnar.py): an
    # insert past the last id draws a new tail (the copy appends it); any other write a new tag (made again).
    db.execute("create table ledger_changes (id integer primary key check (id = 1), n int, tag int, tail int)")
    db.execute("insert into ledger_changes values (1, 0, random(), random())")
    for t, e in ((t, e) for t in COPIED for e in ("insert", "update", "delete")):
        tag = f"case when new.id < (select max(id) from {t}) then random() else tag end" if t in APPENDED else "tag"
        drawn = f"n = n + 1, tail = random(), tag = {tag}" if e == "insert" else "n = n + 1, tag = random()"
        db.execute(f"create trigger ledger_changes_{t}_{e} after {e} on {t} begin update ledger_changes set {drawn}; end")


@migration("m029_grade_value_index")
def m029_grade_value_index(db: Database) -> None:
    # A grader's canned "lowest"/"highest" query (ledger/canned.py) walks its grades in value order and
    # stops at the page: without this it sorted every grade (a 5 s time-out at 10 M requests).
    db["grades"].create_index(["grader", "value"], if_not_exists=True)
