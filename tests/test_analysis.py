"""The report's aggregates as ledger queries (issue 48): DuckDB over the ledger file, offline and
read-only, and every figure it returns equal to its plain computation over the rows (known
answers on a synthesized run: skewed latencies, spikes, failed requests, unequal slices)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.catalogue import REPORT, named
from evalkit.errors import LedgerError, UsageError
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.ledger.analysis import _SPIKE_STEPS, DESCRIBE
from evalkit.ledger.duck import Duck, PerGroup, extension_path

from .report_golden import synth as _synth

DECLARED = [m for m in REPORT if m.agg]
SUMMARY = list(named("summary").values())


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("analysis") / "synth.db"
    _synth().synthesize(path, 4000, ["base", "w8a8"], [1, 4], seed=11)
    return path


@pytest.fixture(scope="module")
def bare(synth: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the run that only the tests of DuckDB's own settings open, with `Duck` in this
    process: DuckDB's copy of SQLite closing its descriptors drops this process's locks on a file
    (why evalkit runs it in the query worker), so it never touches a file another test opens here."""
    path = tmp_path_factory.mktemp("bare") / "bare.db"
    copy_ledger(synth, path)
    return path


def _first_level_rows(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The rows the queries select, picked in Python: each variant's lowest concurrency, the
    baseline's repeats past the run's own left out; with the case's complexity and attributes."""
    with open_ledger(path, create=False) as db:
        run = db.require_run(None)
        baseline, repeats = db.baseline(run["id"]), run.repeats
    rows = list(Database(path).query(
        "select r.*, c.complexity as case_complexity, c.formality as case_formality, c.persona as case_persona "
        "from requests r join cases c on c.id = r.case_id where r.run_id = ? and r.is_warmup = 0 and r.final = 1",
        [run["id"]]))
    first = {v: min(r["concurrency"] or 1 for r in rows if r["variant"] == v) for v in {r["variant"] for r in rows}}
    keep = [r for r in rows if (r["concurrency"] or 1) == first[r["variant"]]
            and (r["variant"] != baseline or r["repeat"] < repeats)]
    return {"id": run["id"], "baseline": baseline, "repeats": repeats}, keep


def _percentile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _value(r: dict[str, Any], source: str) -> float | None:
    if source == "out_tps":
        c, e = r["completion_tokens"], r["e2e_ms"]
        return c / (e / 1000.0) if c and e and r["error_class"] is None else None
    return r[source]


def _plain(m: Any, rows: list[dict[str, Any]]) -> Any:
    """A declared metric computed the plain way: the definition, written out."""
    if m.agg == "count":
        return len(rows)
    if m.agg == "errors":
        return sum(r["error_class"] is not None for r in rows)
    xs = [v for r in rows if (not m.ok_only or r["error_class"] is None) and (v := _value(r, m.source)) is not None]
    if not xs:
        return None
    if m.agg == "mean":
        return sum(xs) / len(xs)
    if m.agg == "max":
        return max(xs)
    if m.agg == "max_pct":
        return 100.0 * max(xs)
    if m.agg == "positive":
        return sum(x > 0 for x in xs)
    return _percentile(xs, float(m.agg[1:]))


def _groups(rows: list[dict[str, Any]], key: str = "case_complexity") -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[(r["variant"], r[key])].append(r)
        if key == "case_complexity":
            out[(r["variant"], "all")].append(r)
    return out


@pytest.fixture(scope="module")
def table(synth: Path) -> tuple[dict, dict]:
    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        got = db.slice_table(run["id"], run["baseline"], run["repeats"], DECLARED, {"ttft": 600.0, "e2e": 12000.0})
    return got, _groups(rows)


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return a == pytest.approx(b, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("metric", DECLARED, ids=lambda m: m.key)
def test_every_declared_metric_of_a_slice_is_its_plain_computation(table, metric):
    got, groups = table
    assert all(_close(got[key][metric.key], _plain(metric, rows)) for key, rows in groups.items())


def test_the_table_has_a_row_per_variant_and_slice_and_one_for_all(table):
    got, groups = table
    assert set(got) == set(groups)


def test_goodput_counts_the_successful_requests_that_met_every_slo(table):
    got, groups = table
    ok = {k: 100.0 * sum(r["error_class"] is None and r["ttft_ms"] <= 600.0 and r["e2e_ms"] <= 12000.0 for r in rows)
          / len(rows) for k, rows in groups.items()}
    assert all(_close(got[k]["goodput_pct"], ok[k]) for k in groups)


def test_a_table_without_an_slo_has_no_goodput(synth):
    with open_ledger(synth, create=False) as db:
        run = db.require_run(None)
        got = db.slice_table(run["id"], db.baseline(run["id"]), run.repeats, DECLARED, {})
    assert {v["goodput_pct"] for v in got.values()} == {None}


def test_the_server_s_timing_methods_are_listed_once(table):
    got, _ = table
    assert got[("base", "all")]["srv_methods"] == ["response"]


def test_the_baseline_s_noise_floor_passes_are_not_counted(synth, table):
    got, groups = table
    assert got[("base", "all")]["n"] == len(groups[("base", "all")])


@pytest.mark.parametrize("stat", DESCRIBE)
@pytest.mark.parametrize("metric", ["ttft_ms", "e2e_ms", "out_tps"])
def test_a_slice_s_distribution_is_its_plain_computation(synth, metric, stat):
    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        got = db.distributions(run["id"], run["baseline"], run["repeats"], ["complexity"], SUMMARY)
    groups = _groups(rows)
    for e in got:
        xs = [v for r in groups[(e["variant"], e["complexity"])] if r["error_class"] is None
              and (v := _value(r, metric)) is not None]
        m = sum(xs) / len(xs)
        want = {"n": len(xs), "mean": m, "std": math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)),
                "p50": _percentile(xs, 50), "p90": _percentile(xs, 90), "p95": _percentile(xs, 95),
                "p99": _percentile(xs, 99), "max": max(xs)}
        assert _close(e[metric][stat], want[stat]), (e["variant"], e["complexity"])


def test_a_distribution_counts_requests_and_errors_per_slice(synth):
    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        got = db.distributions(run["id"], run["baseline"], run["repeats"], ["complexity"], SUMMARY)
    groups = _groups(rows)
    assert [(e["n"], e["errors"]) for e in got] == [
        (len(groups[(e["variant"], e["complexity"])]),
         sum(r["error_class"] is not None for r in groups[(e["variant"], e["complexity"])])) for e in got]


def test_an_attribute_slice_keeps_the_attribute_s_type(synth):
    with open_ledger(synth, create=False) as db:
        run = db.require_run(None)
        got = db.distributions(run["id"], db.baseline(run["id"]), run.repeats, ["formality"], SUMMARY)
    assert {type(e["formality"]) for e in got} == {int}


def test_slices_by_two_attributes_are_their_combinations(synth):
    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        got = db.distributions(run["id"], run["baseline"], run["repeats"], ["persona", "formality"], SUMMARY)
    assert {(e["variant"], e["persona"], e["formality"]) for e in got} == {
        (r["variant"], r["case_persona"], r["case_formality"]) for r in rows}


def test_an_unknown_slice_key_is_refused_naming_the_known_ones(synth):
    with open_ledger(synth, create=False) as db, pytest.raises(UsageError, match="unknown slice field.*persona"):
        run = db.require_run(None)
        db.distributions(run["id"], None, run.repeats, ["colour"], SUMMARY)


def _short_failed(synth: Path, tmp_path: Path) -> Path:
    """A copy of the run where every short case of w8a8's failed (no latency recorded)."""
    path = tmp_path / "failed.db"
    copy_ledger(synth, path)
    raw = Database(path)
    raw.execute("update requests set error_class = 'timeout', ttft_ms = null, e2e_ms = null where variant = 'w8a8' "
                "and case_id in (select id from cases where complexity = 'short')")
    raw.conn.commit()
    raw.conn.close()
    return path


def test_a_slice_where_every_request_failed_has_counts_and_no_latency(synth, tmp_path):
    path = _short_failed(synth, tmp_path)
    with open_ledger(path, create=False) as db:
        run = db.require_run(None)
        got = db.slice_table(run["id"], db.baseline(run["id"]), run.repeats, DECLARED, {})[("w8a8", "short")]
    assert (got["n"] == got["n_errors"], got["ttft_p50_ms"], got["e2e_mean_ms"]) == (True, None, None)


def test_duckdb_installs_and_loads_nothing_by_itself(bare):
    with Duck(bare) as d:
        got = d.rows("select current_setting('autoinstall_known_extensions'), "
                     "current_setting('autoload_known_extensions')")
    assert got == [(False, False)]


def test_the_sqlite_extension_is_the_installed_wheel_s(bare):
    import duckdb

    with Duck(bare) as d:
        loaded = d.rows("select extension_name from duckdb_extensions() where loaded")
    assert (extension_path().parent.name, ("sqlite_scanner",) in loaded) == (f"v{duckdb.__version__}", True)


@pytest.mark.parametrize("sql", ["insert into s.runs (id) values ('x')", "insert into c.requests (id) values (1)"],
                         ids=["ledger", "columnar copy"])
def test_the_ledger_and_its_copy_are_attached_read_only(bare, sql):
    with Duck(bare) as d, pytest.raises(Exception, match="(?i)read.only"):
        d.rows(sql)


def _handles(path: Path) -> int:
    """This process's open files on the ledger or its -wal / -shm."""
    import os

    out = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            out += str(path) in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


def test_a_query_leaves_nothing_open_on_the_ledger_in_this_process(synth):
    import gc

    gc.collect()  # an earlier test's connection left to the collector must not close mid-count
    with open_ledger(synth, create=False) as db:
        before = _handles(synth)
        run = db.require_run(None)
        db.slice_table(run["id"], None, run.repeats, DECLARED, {})
        assert _handles(synth) == before


def _others_could_take_the_wal_index(path: Path) -> bool:
    """Whether another process could lock the -shm's connection bytes exclusively: only when no
    connection of ours holds them (what SQLite asks before it resets the WAL index)."""
    code = ("import fcntl, os, struct, sys; fd = os.open(sys.argv[1] + '-shm', os.O_RDWR); "
            "r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 120, 16, 0)); "
            "print(struct.unpack('hhqqi', r)[0] == fcntl.F_UNLCK)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.integration
def test_a_query_leaves_this_process_s_own_sqlite_locks_in_place(synth, tmp_path):
    # DuckDB's copy of SQLite closing its descriptors in this process would drop our connection's
    # locks (POSIX locks are the process's): another process could then reset the WAL index under it
    path = tmp_path / "held.db"
    copy_ledger(synth, path)
    with open_ledger(path, create=False) as db:
        run = db.require_run(None)
        assert not _others_could_take_the_wal_index(path)
        db.slice_table(run["id"], None, run.repeats, DECLARED, {})
        assert not _others_could_take_the_wal_index(path)


def test_the_query_worker_stops_with_its_ledger(synth):
    with open_ledger(synth, create=False) as db:
        db.client_lag_p99(db.require_run(None)["id"])
        proc = db._worker.proc
    assert proc.wait(timeout=10) == 0


def test_the_query_worker_of_a_ledger_nobody_closed_ends_when_it_is_collected(synth):
    import gc

    from evalkit.ledger.register import untrack

    db = open_ledger(synth, create=False)
    db.client_lag_p99(db.require_run(None)["id"])
    proc = db._worker.proc
    db._db.conn.close()  # its connection, as close() would; the worker is left to the collector
    untrack(db)
    del db
    gc.collect()
    assert proc.wait(timeout=10) == 0


def test_a_query_that_fails_says_so_in_one_line_naming_the_ledger(synth):
    from evalkit.errors import LedgerError

    with open_ledger(synth, create=False) as db, pytest.raises(LedgerError, match=f"^{synth}: query failed: .*no_such"):
        db.query("select * from l.no_such_table")


def test_a_worker_that_died_is_said_and_the_next_query_starts_another(synth):
    from evalkit.errors import LedgerError

    with open_ledger(synth, create=False) as db:
        run_id = db.require_run(None)["id"]
        db.client_lag_p99(run_id)
        db._worker.proc.kill()
        with pytest.raises(LedgerError, match="query worker stopped .exit code -9"):
            db.client_lag_p99(run_id)
        assert db.client_lag_p99(run_id)


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_a_stream_is_the_rows_of_its_last_statement_a_chunk_at_a_time(synth, chunk):
    sqls = ["create temp table t as select range as i from range(23)", "select i, i * i from t order by i"]
    with open_ledger(synth, create=False) as db:
        got = list(db._worker_of().stream(sqls, {}, chunk))
    assert got == [(i, i * i) for i in range(23)]


def test_a_stream_left_early_keeps_the_worker_in_step(synth):
    with open_ledger(synth, create=False) as db:
        rows = db._worker_of().stream(["select range from range(50)"], {}, 4)
        first = [next(rows), next(rows)]
        rows.close()
        assert (first, db.query("select 42")[1]) == ([(0,), (1,)], [(42,)])


def test_a_query_while_a_stream_is_read_is_refused(synth):
    from evalkit.errors import LedgerError

    with open_ledger(synth, create=False) as db:
        rows = db._worker_of().stream(["select range from range(50)"], {}, 4)
        next(rows)
        with pytest.raises(LedgerError, match="while a stream of rows is read"):
            db.query("select 1")
        assert sum(1 for _ in rows) == 49


def test_a_stream_that_fails_says_so_in_one_line_naming_the_ledger(synth):
    from evalkit.errors import LedgerError

    with open_ledger(synth, create=False) as db, pytest.raises(LedgerError, match=f"^{synth}: query failed: .*no_such"):
        list(db.stream(["select * from l.no_such_table"]))


@pytest.mark.parametrize("value", [1.1, 0.30000000000000004, 1e-9, 1.4826, 123456789.12345679, 2.5e300, 5e-324, -0.5,
                                   7, "it's", None])
def test_a_value_bound_into_a_query_reads_back_as_itself(bare, value):
    from evalkit.ledger.duck import literal

    with Duck(bare) as d:
        assert d.rows(f"select {literal(value)}") == [(value,)]


def test_the_client_lag_p99_is_taken_over_every_level_of_a_variant(synth):
    rows = list(Database(synth).query("select variant, client_lag_max_ms from requests where is_warmup = 0"))
    with open_ledger(synth, create=False) as db:
        got = db.client_lag_p99(db.require_run(None)["id"])
    assert all(_close(got[v][0], _percentile([r["client_lag_max_ms"] for r in rows if r["variant"] == v], 99))
               for v in ("base", "w8a8"))


def test_a_run_stamped_by_the_kernel_says_so(synth):
    with open_ledger(synth, create=False) as db:
        got = db.client_lag_p99(db.require_run(None)["id"])
    assert {kernel for _, kernel in got.values()} == {True}


@pytest.mark.parametrize("q", [50, 99, 99.9])
def test_a_gate_s_percentile_target_is_the_report_s_figure(synth, q):
    """`check --target` and the report's tables count the same requests (the baseline's noise-floor
    passes are in neither)."""
    from evalkit.reporting.gate import GateSpec, run_checks

    _, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        _, checks = run_checks(db, None, GateSpec(targets={("ttft_ms", q): 1e9}))
    want = {v: _percentile([r["ttft_ms"] for r in rows if r["variant"] == v and r["error_class"] is None], q)
            for v in ("base", "w8a8")}
    assert all(_close(c.value, want[c.variant]) for c in checks)


def test_recommend_s_groups_count_the_rows_the_report_s_tables_count(synth, table):
    got, _ = table
    with open_ledger(synth, create=False) as db:
        run = db.require_run(None)
        groups = db.first_level_values(run["id"], db.baseline(run["id"]), run.repeats,
                                       {"every": "true", "long": "case_complexity = 'long'"}, ["ttft_ms"])
    assert {(g["group"], g["variant"]): g["n"] for g in groups} == {
        (name, v): got[(v, s)]["n"] for name, s in (("every", "all"), ("long", "long")) for v in ("base", "w8a8")}


def test_recommend_s_values_are_the_successful_ones_in_send_order(synth):
    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        groups = db.first_level_values(run["id"], run["baseline"], run["repeats"], {"every": "true"}, ["ttft_ms"])
    want = {v: [r["ttft_ms"] for r in sorted(rows, key=lambda r: (r["seq"], r["id"]))
                if r["variant"] == v and r["error_class"] is None] for v in ("base", "w8a8")}
    assert {g["variant"]: g["ttft_ms"] for g in groups} == want


@pytest.mark.parametrize("metric", ["ttft_ms", "e2e_ms", "tpot_ms"])
def test_a_case_s_pair_is_its_two_sides_means_over_the_repeats_both_sent(synth, metric):
    from .test_verdicts import case_pairs_of

    run, rows = _first_level_rows(synth)
    with open_ledger(synth, create=False) as db:
        got = db.case_pairs(run["id"], run["baseline"], run["repeats"], metric)
    want = case_pairs_of([{**r, "complexity": r["case_complexity"]} for r in rows], run["baseline"], metric)
    assert [(v, c, cx) for v, c, cx, *_ in got] == [(v, c, cx) for v, c, cx, *_ in want]
    assert all(_close(x, y) for g, w in zip(got, want, strict=True) for x, y in zip(g[3:], w[3:], strict=True))


def test_a_candidate_whose_slice_all_failed_still_has_its_cases_with_no_pairs(synth, tmp_path):
    from evalkit.reporting.report import paired

    path = _short_failed(synth, tmp_path)
    with open_ledger(path, create=False) as db:
        run = db.require_run(None)
        entry = next(p for p in paired(db.case_pairs(run["id"], db.baseline(run["id"]), run.repeats, "ttft_ms"),
                                       "ttft_ms") if p["complexity"] == "short")
    assert (entry["pairs"], entry["delta_pct"]) == (0, None)


def test_the_same_ledger_gives_the_same_figures_to_the_last_bit(synth):
    """Means summed by parallel threads differ in their last bits from run to run: the report must not."""
    with open_ledger(synth, create=False) as db:
        run = db.require_run(None)
        runs = [db.distributions(run["id"], None, run.repeats, ["complexity"], SUMMARY) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_duckdb_runs_one_thread(bare):
    with Duck(bare) as d:
        assert d.rows("select current_setting('threads')") == [(1,)]


def test_duckdb_draws_no_progress_bar_into_the_output(bare):
    """DuckDB draws a bar on stdout for a query over 2 s: it would land inside `report --json`."""
    with Duck(bare) as d:
        assert d.rows("select current_setting('enable_progress_bar')") == [(False,)]


def test_duckdb_spills_to_its_own_folder_and_removes_it(bare):
    d = Duck(bare)
    spill = Path(d.rows("select current_setting('temp_directory')")[0][0])
    d.close()
    assert (spill.name.startswith("evalkit-duckdb-spill-"), spill.exists()) == (True, False)


@pytest.mark.parametrize(("fails", "limits", "kind"), [
    (1, ["128MB", "512MB"], "ok"), (3, ["128MB", "512MB", "2GB"], "error"), (0, ["128MB"], "ok")])
def test_a_statement_out_of_memory_is_retried_with_a_larger_pool(monkeypatch, fails, limits, kind):
    """The query worker's loop, in this process: DuckDB stood in for by one that runs out of memory
    ``fails`` times, then answers."""
    import io
    import types

    from evalkit.ledger import duck, duck_worker

    class OutOfMemoryException(Exception):  # DuckDB's own is matched by name
        pass

    seen: list[str] = []

    class Tight:
        def __init__(self, path, limit):
            seen.append(limit)

        def close(self):
            return None

        def clear(self):
            return True

        def columns(self, sql, params):
            if len(seen) <= fails:
                raise OutOfMemoryException("could not allocate block")
            return ["n"], [(1,)]

    monkeypatch.setattr(duck, "Duck", Tight)
    inp, out = io.BytesIO(), io.BytesIO()
    duck_worker._send(inp, ("select 1", {}, None, False))
    inp.seek(0)
    monkeypatch.setattr(duck_worker.sys, "stdin", types.SimpleNamespace(buffer=inp))
    monkeypatch.setattr(duck_worker.sys, "stdout", types.SimpleNamespace(buffer=out))
    duck_worker.serve("ledger.db")
    out.seek(0)
    assert (duck_worker._receive(out)[0], seen) == (kind, limits)


def test_a_session_keeps_its_tables_between_calls_and_drops_them_after(synth: Path) -> None:
    """`Ledger.session`: a temp table one call makes, the next reads; gone when the block ends."""
    with open_ledger(synth, create=False) as db:
        with db.session():
            db.query("create temp table kept as select 7 as x")
            inside = db.query("select x from kept")[1]
        with pytest.raises(LedgerError, match="kept"):
            db.query("select x from kept")
    assert inside == [(7,)]


def test_a_query_s_temp_tables_are_gone_for_the_next(synth: Path) -> None:
    with open_ledger(synth, create=False) as db:
        db.query("create temp table left_over as select 7 as x")
        with pytest.raises(LedgerError, match="left_over"):
            db.query("select x from left_over")


def _probe(db: Any) -> Any:
    return db.query("select getvariable('evalkit_probe')")[1][0][0]


def test_the_next_query_on_an_unchanged_ledger_keeps_the_connection(synth: Path, tmp_path: Path) -> None:
    """Making a connection is most of a small query's time: the worker keeps it while nothing changed."""
    with open_ledger(copy_ledger(synth, tmp_path / "kept.db"), create=False) as db:
        db.query("set variable evalkit_probe = 7")
        assert _probe(db) == 7


def test_a_write_to_the_ledger_ends_the_kept_connection(synth: Path, tmp_path: Path) -> None:
    path = copy_ledger(synth, tmp_path / "written.db")
    with open_ledger(path, create=False) as db:
        db.query("set variable evalkit_probe = 7")
        before = db.query("select count(*) from l.runs")[1][0][0]
        db.create_run({"id": "another", "created_at": "2026-01-01T00:00:00", "status": "complete"})
        assert (db.query("select count(*) from l.runs")[1][0][0], _probe(db)) == (before + 1, None)


def test_a_ledger_renamed_over_the_file_is_not_the_kept_connection_s(synth: Path, tmp_path: Path) -> None:
    """A ledger written beside and renamed over the file: a connection made before reads the old
    file, so the worker does not keep it (`Duck` in this process: neither copy is opened here otherwise)."""
    path, other = copy_ledger(synth, tmp_path / "renamed.db"), copy_ledger(synth, tmp_path / "other.db")
    with Duck(path) as d:
        kept = d.still_fresh(path)
        os.replace(other, path)
        assert (kept, d.still_fresh(path)) == (True, False)


def test_a_session_out_of_memory_makes_its_tables_again_on_the_larger_pool(monkeypatch) -> None:
    """The worker's loop, in this process: a session's second frame runs out of memory once; the
    retry's connection (512 MB) runs the first frame's table again, then the frame; the session's
    end closes it, and a frame after it starts on 128 MB."""
    import io
    import types

    from evalkit.ledger import duck, duck_worker

    class OutOfMemoryException(Exception):  # DuckDB's own is matched by name
        pass

    ran: list[tuple[str, str]] = []
    failed: list[bool] = []

    class Tight:
        def __init__(self, path, limit):
            self.limit = limit

        def close(self):
            ran.append((self.limit, "closed"))

        def clear(self):
            return True

        def columns(self, sql, params):
            if sql == "select n from t" and not failed:
                failed.append(True)
                raise OutOfMemoryException("could not allocate block")
            ran.append((self.limit, sql))
            return ["n"], [(1,)]

    monkeypatch.setattr(duck, "Duck", Tight)
    inp, out = io.BytesIO(), io.BytesIO()
    for frame in [(["create temp table t as select 1 as n"], {}, None, True), ("select n from t", {}, None, True),
                  (None, {}, None, False), ("select 2", {}, None, False)]:
        duck_worker._send(inp, frame)
    inp.seek(0)
    monkeypatch.setattr(duck_worker.sys, "stdin", types.SimpleNamespace(buffer=inp))
    monkeypatch.setattr(duck_worker.sys, "stdout", types.SimpleNamespace(buffer=out))
    duck_worker.serve("ledger.db")
    assert ran == [("128MB", "create temp table t as select 1 as n"), ("128MB", "closed"),
                   ("512MB", "create temp table t as select 1 as n"), ("512MB", "select n from t"),
                   ("512MB", "closed"), ("128MB", "select 2"), ("128MB", "closed")]


def _batched(step: Any, most: int) -> Any:
    return replace(step, most=most) if isinstance(step, PerGroup) else step


@pytest.mark.parametrize("most", [1, 700, 10**9], ids=["a group a batch", "a few groups a batch", "one batch"])
def test_the_spike_medians_a_batch_of_slices_at_a_time_equal_them_all_at_once(bare: Path, most: int) -> None:
    """`PerGroup` (what bounds a percentile's values at 10 M rows) changes no figure: the spikes'
    medians and MADs of the slices a batch at a time, a group past the batch's size alone, equal
    DuckDB's over every slice at once (the statements as written, their batch `true`)."""
    steps = [str(_SPIKE_STEPS[0]).format(metric="ttft_ms"), *_SPIKE_STEPS[1:]]
    whole = [s.sql.replace("{batch}", "true") if isinstance(s, PerGroup) else s for s in steps]
    whole = [f"create temp table {s.into} as {w}" if isinstance(s, PerGroup) else w for s, w in zip(steps, whole, strict=True)]
    read = "select * from med join mad using (variant, load_level, complexity) order by all"
    with Duck(bare) as d:
        params = {"run": d.rows("select id from l.runs")[0][0]}
        for s in [_batched(s, most) for s in steps]:
            d.columns(s, params)
        got = d.rows(read)
    with Duck(bare) as d:
        for s in whole:
            d.columns(s, params)
        want = d.rows(read)
    assert got == want


def test_a_batch_is_a_group_past_its_size_or_groups_up_to_it(bare: Path) -> None:
    """Every group in exactly one batch, in key order; a NULL key kept (`is not distinct from`)."""
    step = PerGroup("select 1 from t where {batch}", "t", ("k",), most=5)
    with Duck(bare) as d:
        d.columns("create temp table t as select * from (values (1), (1), (2), (3), (3), (3), (3), (3), (3), (null)) v(k)")
        got = step.batches(d, {})
        rows = [d.rows(f"select k from t where {b} order by k nulls first") for b in got]
    assert [sorted({r[0] for r in b}, key=lambda k: (k is not None, k or 0)) for b in rows] == [[1, 2], [3], [None]]


def test_groups_past_the_most_a_condition_names_are_one_batch(bare: Path) -> None:
    """Thousands of small groups (`--by case_id`) are not listed in a condition every row is tested on."""
    step = PerGroup("select 1 from t where {batch}", "t", ("k",), most=5, max_groups=3)
    with Duck(bare) as d:
        d.columns("create temp table t as select * from (values (1), (1), (2), (3), (3), (3), (3), (3), (3), (null)) v(k)")
        got = step.batches(d, {})
    assert got == ["true"]
