"""The ledger's two views, defined once, the tables the columnar copy holds, and Datasette's
`requests_joined` (nothing of evalkit imported: the DuckDB query worker reads this module too)."""

from __future__ import annotations

from collections.abc import Iterable

# What the analysis queries read, copied into DuckDB's own storage (ledger/columnar.py): every table
# they name, so none of their joins reads a side through the sqlite extension.
COPIED = ("requests", "grades", "runs", "cases")
APPENDED = ("requests", "grades")  # integer ids that grow: rows inserted past the copy's last are appended

# The two views every read of measured rows and newest grades goes through (migration m027), in SQL that SQLite
# and DuckDB read alike: the columnar copy (columnar.py) defines them over its own tables with it.
VIEWS = {
    "measured": "select r.*, coalesce(nullif(r.concurrency, 0), 1) as load_level, r.error_class is null as ok "
                "from requests r where r.is_warmup = 0 and r.final = 1",
    "grade_latest": "select g.* from grades g where g.error_class is null and not exists (select 1 from grades h "
                    "where h.request_id = g.request_id and h.grader = g.grader and h.error_class is null "
                    "and h.id > g.id)",
}

# The grades a newer one by the same grader of the same request replaced (a kept grade: no error, none newer):
# few or none, as a grade is seldom written twice. The copy holds them as a table made once per state, so a
# query keeps the newest grades by an anti-join on this short list, never by grouping every grade again.
SUPERSEDED = ("select g.id from {grades} g join (select request_id, grader, max(id) as top from {grades} "
              "where error_class is null{new} group by all having count(*) > {least}) x using (request_id, grader) "
              "where g.error_class is null and g.id < x.top")
# `grade_latest` in the copy: the same rows as the ledger's view, through that list
COPY_VIEWS = {**VIEWS, "grade_latest": "select g.* from grades g where g.error_class is null "
                                       "and g.id not in (select id from grade_superseded)"}


def requests_view_sql(grade_columns: Iterable[tuple[str, str, str]], level: str = "level") -> str:
    """`requests_joined`: one row per request with its case and the newest grade of each grader,
    given as (column name, grader, field) with field `value` or `passed`. ``level``: the load
    level's column as the schema then named it (`phase` before m015)."""
    sub = "".join(
        f"(select {field} from grades g where g.request_id = r.id and g.grader = '{grader}' "
        f"order by g.id desc limit 1) as {column},\n"
        for column, grader, field in grade_columns
        if column.isidentifier() and grader.replace("-", "_").isidentifier() and field in ("value", "passed"))
    return f"""
        create view requests_joined as
        select r.id, r.run_id, r.variant, r.replica, c.task, c.persona, c.complexity, c.formality, r.case_id,
               r.repeat, r.{level}, r.concurrency, r.is_warmup, r.final, r.started_at, r.ttft_ms,
               r.ttft_from_schedule_ms, r.client_wait_ms, r.tpot_ms, r.itl_mean_ms, r.e2e_ms, r.prompt_tokens,
               r.completion_tokens, r.finish_reason, r.error_class, r.srv_queue_ms, r.srv_prefill_ms,
               r.srv_decode_ms, r.srv_kv_cache_usage_peak, r.srv_preemptions,
               {sub}r.text
        from requests r join runs u on u.id = r.run_id
        left join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
    """
