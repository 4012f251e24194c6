"""The ledger's two views, defined once, and the tables the columnar copy holds (no imports: the
DuckDB query worker reads them too)."""

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
