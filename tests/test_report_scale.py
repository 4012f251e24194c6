"""Reports at any size and a command line that starts at once (issue 37): the help loads none of
the heavy libraries, the synthesized ledger is a ledger the report reads, and what the report
reads a slice or a stretch at a time equals its definition over every row (the report's own known
answers: tests/test_report_golden.py)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evalkit.grading.registry import use_run
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.reporting.by_attr import measured
from evalkit.reporting.document import findings_blocks
from evalkit.reporting.findings import build_report, kv_use, report_findings, request_rows
from evalkit.reporting.report import quality, to_json
from evalkit.reporting.rows import Column, RunRows
from evalkit.reporting.selection import by_variant, first_level
from evalkit.reporting.spike_summary import SPIKES_TOP, Spikes
from evalkit.spec.traces import TraceError, iter_trace, load_trace
from evalkit.stats import mean

from .report_golden import SHAPES, close, synth

ROOT = Path(__file__).resolve().parent.parent

HEAVY = ("scipy", "numpy", "sqlite_utils", "aiohttp", "datasets", "torch", "sentence_transformers", "jsonschema",
         "pydantic", "duckdb")

_PROBE = ("import sys\nfrom click.testing import CliRunner\nfrom evalkit.cli import cli\n"
          "for args in (['--help'], ['report', '--help'], ['run', '--help']):\n"
          "    assert CliRunner().invoke(cli, args).exit_code == 0, args\n"
          f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n")


@pytest.mark.integration
def test_the_help_loads_no_heavy_library():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


@pytest.fixture(scope="module")
def synth_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("synth") / "synth.db"
    return path, synth().synthesize(path, 5000, ["base", "w8a8", "fp8"], [1, 4], seed=3)


def test_the_synthesizer_writes_the_rows_asked_for(synth_ledger):
    path, info = synth_ledger
    rid = open_ledger(path, create=False).require_run(None)["id"]
    assert len(request_rows(open_ledger(path, create=False), rid)) == 5000


def test_the_synthesizer_grades_every_successful_request_twice(synth_ledger):
    path, info = synth_ledger
    rows = request_rows(open_ledger(path, create=False), info["run_id"])
    assert info["grades"] == 2 * sum(r["error_class"] is None for r in rows)


def test_a_synthesized_run_has_every_variant_level_and_complexity(synth_ledger):
    path, info = synth_ledger
    rows = request_rows(open_ledger(path, create=False), info["run_id"])
    assert {(r["variant"], r["concurrency"], r["complexity"]) for r in rows} == \
        {(v, c, cx) for v in ("base", "w8a8", "fp8") for c in (1, 4) for cx in ("short", "medium", "long")}


def test_a_synthesized_run_has_spikes_of_each_cause(synth_ledger):
    path, info = synth_ledger
    _, fnd = report_findings(open_ledger(path, create=False), info["run_id"])
    assert {"preemption", "queued", "cold/long prefill"} <= {s["cause"] for s in fnd["spikes"]}


def _spikes(n: int) -> list[dict[str, Any]]:
    return [{"variant": "ab"[k % 2], "concurrency": 1 + k % 3, "complexity": "long", "metric": "ttft_ms",
             "cause": ("queued", "preemption")[k % 5 == 0], "robust_z": float(k), "line": f"spike {k}"}
            for k in range(n)]


def test_the_json_report_lists_the_largest_spikes():
    js = json.loads(to_json({"findings": {"spikes": _spikes(500)}}))
    assert [s["robust_z"] for s in js["findings"]["spikes"]] == [float(k) for k in range(499, 499 - SPIKES_TOP, -1)]


def test_the_json_report_says_how_many_spikes_there_are():
    assert json.loads(to_json({"findings": {"spikes": _spikes(500)}}))["findings"]["spikes_total"] == 500


def test_the_json_report_counts_every_spike_per_slice_and_cause():
    counts = json.loads(to_json({"findings": {"spikes": _spikes(500)}}))["findings"]["spike_counts"]
    assert (sum(c["n"] for c in counts), len(counts)) == (500, 12)  # 2 variants x 3 levels x 2 causes


def test_the_text_report_counts_spikes_per_slice_and_cause():
    lines = findings_blocks({"spikes": _spikes(500), "paired": [], "verdicts": [], "notes": []}, None)
    assert "  a long c=3 TTFT: 67 queued, 16 preemption" in lines  # k = 2 mod 6: 83, of which k = 20 mod 30: 16


def _tied(n: int) -> list[dict[str, Any]]:
    """Spikes whose robust z repeats (k mod 7): ties broken by their order, as a stable sort does."""
    return [{**s, "robust_z": float(k % 7), "request_id": k} for k, s in enumerate(_spikes(n))]


def test_the_largest_spikes_are_a_stable_sort_s():
    top = sorted(_tied(300), key=lambda s: -s["robust_z"])[:40]  # columns a spike was not given: None
    assert Spikes(_tied(300)).largest(40) == [{k: s.get(k) for k in Spikes.COLUMNS} for s in top]


def test_spikes_iterate_in_the_order_they_came():
    assert [s["request_id"] for s in Spikes(_tied(300))] == list(range(300))


def test_spike_counts_are_a_counter_s_largest_first():
    got = Counter((s["variant"], s["concurrency"], s["complexity"], s["metric"], s["cause"]) for s in _tied(300))
    assert [(c["variant"], c["concurrency"], c["complexity"], c["metric"], c["cause"], c["n"])
            for c in Spikes(_tied(300)).counts()] == \
        [(*k, n) for k, n in sorted(got.items(), key=lambda kv: (-kv[1], *map(str, kv[0])))]


def test_spikes_added_in_two_goes_are_one_set():
    s = Spikes(_tied(100))
    s.add(_tied(300)[100:])
    assert s.request_ids() == list(range(300))


def test_closed_spikes_answer_no_more():
    s = Spikes(_tied(10))
    s.close()
    with pytest.raises(sqlite3.ProgrammingError):
        len(s)


def _dict_rows(db: Any, run_id: str) -> list[dict[str, Any]]:
    """The report rows as dicts, built the way the report built them before columns (one dict a row)."""
    grades, cases, out = db.latest_grades(run_id), db.case_fields(run_id, lean=True), []
    for r in db.iter_measured(run_id, lean=True, with_cases=False):
        del r["_case"]
        r.update(cases[r["case_id"]])
        r["grades"] = grades.get(r["id"], {})
        raw = r.get("attributes_json")
        r["attributes"] = json.loads(raw) if raw else \
            {k: r[k] for k in ("task", "persona", "candidate", "formality") if r.get(k) is not None}
        r["out_tps"] = r["completion_tokens"] / (r["e2e_ms"] / 1000.0) \
            if r["completion_tokens"] and r["e2e_ms"] and r["error_class"] is None else None
        out.append(r)
    return out


def test_rows_read_as_columns_equal_rows_read_as_dicts(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    assert [dict(r) for r in request_rows(db, info["run_id"])] == _dict_rows(db, info["run_id"])


def test_rows_read_as_columns_keep_each_value_s_type(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    new = request_rows(db, info["run_id"])
    assert [{k: type(v) for k, v in r.items()} for r in new] == \
        [{k: type(v) for k, v in r.items()} for r in _dict_rows(db, info["run_id"])]


def test_a_row_is_a_mapping_like_the_dict_it_replaces(synth_ledger):
    path, info = synth_ledger
    r = request_rows(open_ledger(path, create=False), info["run_id"])[0]
    assert (r.get("no such column"), r.get("no such column", 7), "ttft_ms" in r, "no such column" in r) == \
        (None, 7, True, False)


def test_a_row_raises_key_error_for_an_unknown_column(synth_ledger):
    path, info = synth_ledger
    r = request_rows(open_ledger(path, create=False), info["run_id"])[0]
    with pytest.raises(KeyError):
        r["no such column"]


def test_a_slice_s_rows_are_freed_as_soon_as_the_report_lets_them_go(synth_ledger):
    """No reference cycle keeps a slice alive until the cyclic collector runs (at a million rows
    that held a slice or two past its use: the report's peak)."""
    import gc

    from evalkit.reporting.rows import Table
    from evalkit.reporting.selection import by_variant, first_level

    path, info = synth_ledger
    db = open_ledger(path, create=False)
    gc.collect()
    gc.disable()
    try:
        rows = request_rows(db, info["run_id"], "base", 1)
        first_level(rows), by_variant(rows), [(r["attributes"], r["grades"], r["out_tps"]) for r in rows[:50]]
        del rows
        assert sum(type(o) is Table for o in gc.get_objects()) == 0
    finally:
        gc.enable()


def test_a_grader_s_views_read_as_the_list_of_its_grades(synth_ledger):
    from evalkit.reporting.grade_views import grade_views

    path, info = synth_ledger
    rows = request_rows(open_ledger(path, create=False), info["run_id"], "base", 1)
    views = grade_views(rows, "formality")
    listed = [{**r["grades"]["formality"], "case_id": r["case_id"]} for r in rows if "formality" in r["grades"]]
    assert (len(views), list(views), views[3], list(views[2:5])) == (len(listed), listed, listed[3], listed[2:5])


def test_a_spike_reads_as_the_dict_it_replaced():
    from evalkit.reporting.spike_summary import Spike

    s = Spike(7, "w8a8", "long", "c1", 4, "ttft_ms", 2599.6, 178.5, 92.5, "queued", "server queue 2240 ms")
    assert dict(s) == {"request_id": 7, "variant": "w8a8", "complexity": "long", "case_id": "c1", "concurrency": 4,
                       "metric": "ttft_ms", "value": 2599.6, "slice_median": 178.5, "robust_z": 92.5,
                       "cause": "queued", "evidence": "server queue 2240 ms",
                       "line": "w8a8 long c=4 c1: TTFT 2,600 ms (slice median 178 ms, robust z 92.5): queued: "
                               "server queue 2240 ms"}


@pytest.mark.parametrize("values", [
    [1.5, None, 2.25], [3, None, -(2**40)], ["a", None, "b", "a"], [None, None], [1, 2.5, None, "x", b"y"],
    [None, 4, 5], [2**62, 1], [127, None, -127], [128, None, -128], [32767, None, -32767], [32768, None, 0],
    [2**31 - 1, None, -(2**31) + 1], [2**31, None], [*(f"s{i}" for i in range(200)), None],
])
def test_a_column_reads_back_every_value_as_it_was(values):
    c = Column()
    c.extend(values[:2])
    c.extend(values[2:])
    c.compact()
    get = c.getter()
    assert [(get(i), type(get(i))) for i in range(len(values))] == [(v, type(v)) for v in values]


def test_a_trace_limit_reads_no_further_than_its_rows(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 5, "input_length": 10, "output_length": 5}\n'
                     '{"timestamp": 9, "input_length": 10, "output_length": 5}\nnot json: never read\n')
    assert [r.index for r in load_trace(trace, "mooncake", 2)] == [1, 2]


def test_a_trace_is_read_as_it_is_replayed(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n')
    rows = iter_trace(trace, "mooncake")
    assert next(rows).index == 1  # the bad second line is an error only when it is reached


def test_a_trace_s_bad_row_past_the_limit_is_still_an_error_without_one(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n')
    with pytest.raises(TraceError, match=":2: not valid JSON"):
        load_trace(trace, "mooncake")


def test_the_streamed_report_has_a_table_row_per_variant_and_slice(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    rep = build_report(db, info["run_id"])
    assert [(r["variant"], r["complexity"]) for r in rep["rows"]] == \
        [(v, s) for v in ("base", "w8a8", "fp8") for s in ("short", "medium", "long", "all")]


@pytest.mark.parametrize(("variant", "level"), [("base", 1), ("w8a8", 4), ("fp8", None), (None, 4)])
def test_a_slice_s_rows_are_the_run_s_rows_of_that_slice(synth_ledger, variant, level):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    every = [dict(r) for r in request_rows(db, info["run_id"])
             if variant in (None, r["variant"]) and level in (None, r["concurrency"] or 1)]
    assert [dict(r) for r in request_rows(db, info["run_id"], variant, level)] == every


def test_the_levels_from_sql_are_the_levels_of_the_rows(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    assert db.slice_levels(info["run_id"]) == {"base": {1, 4}, "w8a8": {1, 4}, "fp8": {1, 4}}


def test_the_streamed_findings_decide_the_margins_given(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    _, fnd = report_findings(db, info["run_id"], margins="schema_pass=-2pp,ttft_mean=+10%")
    assert len(fnd["verdicts"]) == 4


def test_run_rows_are_every_row_in_order(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    assert [dict(r) for r in RunRows(db, info["run_id"], size=700)] == [dict(r) for r in request_rows(db, info["run_id"])]


def _study_from_rows(db: Any, run: Any, rows: list[Any], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The study's table by its definition, from every row: each variant's first level, its
    successful cases' means, its servers' KV cache up to their last request, its quality against
    the baseline's successful first-level cases (the noise-floor passes out)."""
    base = db.baseline(run["id"])
    first = by_variant(measured(first_level(rows), base, run.repeats))
    ttft = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "ttft_ms"}
    e2e = {(p["variant"], p["complexity"]): p for p in pairs if p["metric"] == "e2e_ms"}
    base_ok = [r for r in first.get(base, []) if r["error_class"] is None]
    out = []
    for v, vall in sorted(by_variant(rows).items()):
        vr = first.get(v, [])
        ok = [r for r in vr if r["error_class"] is None]
        e: dict[str, Any] = {"variant": v, "is_baseline": v == base, "n": len(vr), "errors": len(vr) - len(ok)}
        for cx in ("short", "medium", "long"):
            t = ttft.get((v, cx))
            e[f"ttft_mean_{cx}_ms"] = mean([r["ttft_ms"] for r in ok if r["complexity"] == cx])
            e[f"ttft_tax_{cx}_pct"], e[f"ttft_tax_{cx}_ci_pct"] = (t["delta_pct"], t["ci_pct"]) if t else (None, None)
        for key, got in (("ttft_tax_all", ttft), ("e2e_delta_all", e2e)):
            t = got.get((v, "all"))
            e[f"{key}_pct"], e[f"{key}_ci_pct"] = (t["delta_pct"], t["ci_pct"]) if t else (None, None)
        m = e2e.get((v, "medium"))
        e["e2e_mean_medium_ms"] = mean([r["e2e_ms"] for r in ok if r["complexity"] == "medium"])
        e["e2e_delta_medium_pct"], e["e2e_delta_medium_ci_pct"] = (m["delta_pct"], m["ci_pct"]) if m else (None, None)
        e["ttft_max_ms"] = max((r["ttft_ms"] for r in ok if r["ttft_ms"] is not None), default=None)
        ends: dict[Any, float] = {}
        for r in vall:
            if r["mono_start_ms"] is not None:
                ends[r["replica"]] = max(ends.get(r["replica"], 0.0), r["mono_start_ms"] + (r["e2e_ms"] or 0.0))
        e.update(kv_use(db, run["id"], v, ends))
        e["preemptions"] = db.series_delta(run["id"], v, "num_preemptions_total") or 0.0
        e.update(quality(ok, None if v == base else base_ok))
        out.append(e)
    return out


@pytest.fixture(scope="module")
def drift_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The synthesized run with drift grades too: the study's quality then has a p-value the
    report's Holm family adjusts (in the table, not the study)."""
    path = tmp_path_factory.mktemp("synth") / "drift.db"
    return path, synth().synthesize(path, 5000, ["base", "w8a8", "fp8"], [1, 4], seed=3, drift=True)


@pytest.mark.parametrize("shape", ["plain", *sorted(SHAPES)])
def test_the_study_from_the_ledger_is_the_study_from_every_row(drift_ledger, tmp_path, shape):
    path, info = drift_ledger
    copy = copy_ledger(path, tmp_path / "shaped.db")
    db = open_ledger(copy, create=False)
    for sql in SHAPES.get(shape, []):
        db._db.execute(sql)
    db._db.conn.commit()
    run = db.require_run(info["run_id"])
    use_run(run)
    rows = request_rows(db, info["run_id"])
    rep, fnd = report_findings(db, info["run_id"])
    want = json.loads(json.dumps(_study_from_rows(db, run, rows, rep["paired"]), default=str))
    assert close(json.loads(json.dumps(fnd["study_summary"], default=str)), want) == []


@pytest.mark.parametrize("shape", ["plain", "two_servers", "a_label_over_two_levels"])
def test_the_level_outline_from_sql_is_the_one_from_the_rows(synth_ledger, tmp_path, shape):
    path, info = synth_ledger
    copy = tmp_path / "shaped.db"
    copy_ledger(path, copy)
    db = open_ledger(copy, create=False)
    for sql in SHAPES.get(shape, []):
        db._db.execute(sql)
    db._db.conn.commit()
    rows = request_rows(db, info["run_id"])
    outline = db.level_outline(info["run_id"])
    expected: dict[tuple[str, str], dict] = {}  # per (variant, label) and replica: first send, last end
    for r in rows:
        if r["mono_start_ms"] is not None:
            sp = expected.setdefault((r["variant"], r["level"] or "main"), {})
            a, b = r["mono_start_ms"], r["mono_start_ms"] + (r["e2e_ms"] or 0.0)
            lo, hi = sp.get(r["replica"], (a, b))
            sp[r["replica"]] = (min(lo, a), max(hi, b))
    assert [(k, list(sp.items())) for k, sp in outline["spans"].items()] == \
        [(k, list(sp.items())) for k, sp in expected.items()]


@pytest.mark.parametrize(("values", "itemsize"), [
    ([0, 1, None], 1), ([-127, 127], 1), ([128, None], 2), ([-32767, 32767], 2), ([40_000, None], 4),
    ([2**31], 8), (["a", "b", None], 1), ([f"s{i}" for i in range(200)], 2),
])
def test_a_column_is_kept_in_the_narrowest_type_that_holds_it(values, itemsize):
    c = Column()
    c.extend(values)
    c.compact()
    assert c.data.itemsize == itemsize


@pytest.mark.parametrize("values", [[0, 1, None], [128, None, -5], ["a", None, "b"], [2**31, None]])
def test_a_narrowed_column_s_nulls_and_floats_agree_with_its_values(values):
    c = Column()
    c.extend(values)
    c.compact()
    assert c.nulls().tolist() == [v is None for v in values]
    if not any(isinstance(v, str) for v in values):
        assert [None if f != f else f for f in c.floats().tolist()] == [None if v is None else float(v) for v in values]


def test_rows_read_with_some_columns_equal_those_columns_of_every_row(synth_ledger):
    """A reader that declares the columns and graders it reads gets the same values of them."""
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    full = request_rows(db, info["run_id"], "w8a8", 4)
    some = request_rows(db, info["run_id"], "w8a8", 4, only={"ttft_ms", "level"}, graders={"schema"})
    assert [(r["id"], r["ttft_ms"], r["level"], r["complexity"], r["grades"].get("schema")) for r in some] == \
        [(r["id"], r["ttft_ms"], r["level"], r["complexity"], r["grades"].get("schema")) for r in full]


def test_rows_read_with_some_columns_have_no_other_column(synth_ledger):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    some = request_rows(db, info["run_id"], "w8a8", 4, only={"ttft_ms"}, graders={"schema"})
    assert ("srv_queue_ms" in some[0], set(some[0]["grades"])) == (False, {"schema"})


@pytest.mark.parametrize("where", [{"seqs": (1, 500)}, {"variant": "w8a8", "level": 4},
                                   {"variant": "w8a8", "level": 4, "graders": ["schema"]}])
def test_a_slice_s_grades_are_read_through_its_requests(synth_ledger, where):
    """A stretch or slice reads its own requests' grades by index, not every grade of the run:
    that scan made a long run's report quadratic (one scan per stretch)."""
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    seen: list[str] = []
    db._db.conn.set_trace_callback(seen.append)
    try:
        next(db.latest_grade_chunks(info["run_id"], **where))
    finally:
        db._db.conn.set_trace_callback(None)
    sql = next(s for s in seen if "grade_latest g" in s)
    plan = " | ".join(r[3] for r in db._db.execute("explain query plan " + sql).fetchall())
    assert "SCAN g" not in plan and "USING INDEX idx_grades_request_id" in plan, plan


@pytest.mark.parametrize("where", [{}, {"variant": "w8a8", "level": 4}])
def test_a_read_of_some_graders_grades_has_theirs_alone(synth_ledger, where):
    path, info = synth_ledger
    db = open_ledger(path, create=False)
    assert {g[1] for chunk in db.latest_grade_chunks(info["run_id"], graders=["schema"], **where) for g in chunk} == {"schema"}


def test_an_aggregate_asked_again_is_the_same_until_the_ledger_changes(synth_ledger, tmp_path):
    import sqlite3

    path, info = synth_ledger
    copy = copy_ledger(path, tmp_path / "copy.db")
    db = open_ledger(copy, create=False)
    run_id = info["run_id"]
    first = db.slice_levels(run_id)
    first["base"].add(99)  # a caller changing its answer changes no later one
    assert db.slice_levels(run_id)["base"] == {1, 4}
    other = sqlite3.connect(copy)  # a write by another connection
    other.execute("update requests set concurrency = 8 where run_id = ? and variant = 'base' and concurrency = 4",
                  [run_id])
    other.commit()
    other.close()
    assert db.slice_levels(run_id)["base"] == {1, 8}
    assert db.level_outline(run_id)["traced"]["base"] == 0
    db._db.execute("update requests set trace_row = 1 where run_id = ? and variant = 'base' and concurrency = 8",
                   [run_id])  # and one by this connection
    assert db.level_outline(run_id)["traced"]["base"] > 0


MARKED = ["update requests set timing_suspect = (id % 7 = 0), timestamp_source = case when id % 3 = 0 then 'kernel' "
          "when id % 3 = 1 then 'user' end",
          "update requests set level = 'burst' where id % 11 = 0",
          "update requests set level = '' where id % 13 = 0"]


def test_the_client_check_s_marks_are_the_rows_counted(synth_ledger, tmp_path):
    """`Ledger.level_marks` per level label in the order the rows first show it: rows, the clocks
    that stamped them (none, or an empty label, read as the user's clock and "main"), suspect rows."""
    path, info = synth_ledger
    db = open_ledger(copy_ledger(path, tmp_path / "marked.db"), create=False)
    for sql in MARKED:
        db._db.execute(sql)
    db._db.conn.commit()
    want: dict[str, list[Any]] = {}
    for r in request_rows(db, info["run_id"]):
        acc = want.setdefault(r["level"] or "main", [0, set(), 0])
        acc[0] += 1
        acc[1].add(r["timestamp_source"] or "user")
        acc[2] += bool(r["timing_suspect"])
    assert list(db.level_marks(info["run_id"]).items()) == [(k, tuple(v)) for k, v in want.items()]
