"""Each load level's figures as ledger queries (issue 48, `ledger/level_reads.py`): every figure
equal to its plain computation over the rows, on a synthesized sweep shaped at the margins (two
servers on different clocks, references missing or zero, an open-loop level, prefix and
conversation fields), plus the order and edges the report relies on."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.ledger import copy_ledger, open_ledger
from evalkit.reporting.plots import QUALITY_GRADERS

from .report_golden import synth as _synth
from .test_analysis import _percentile

SLO_KEYS = ("ttft", "tpot", "e2e")
SHAPE = [
    # a second server whose sender's clock is far from the first's
    "update requests set replica = 1, mono_start_ms = mono_start_ms + 1e7 where id % 3 = 0",
    # references without any latency (their case's repeat 0 stands in), or a zero TTFT (no slowdown)
    "update requests set ttft_ms = null, tpot_ms = null, e2e_ms = null where level = 'c=1' and repeat > 0 and id % 5 = 0",
    "update requests set ttft_ms = 0 where level = 'c=1' and id % 11 = 0",
    # prefix sharing by design and from the server's cache; multi-turn conversations
    "update requests set designed_shared_tokens = prompt_tokens / 2 where id % 5 = 0",
    "update requests set cached_prompt_tokens = case when id % 7 = 0 then 16 else 0 end where id % 2 = 0",
    "update requests set conversation_id = 'conv-' || case_id where id % 4 = 0",
]


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("levels") / "synth.db"
    _synth().synthesize(base, 3000, ["base", "w8a8"], [1, 4], seed=5)
    return shaped_copy(base, base.with_name("shaped.db"), SHAPE)


def shaped_copy(base: Path, path: Path, statements: list[str]) -> Path:
    """A copy of the ledger ``base`` changed by ``statements``."""
    copy_ledger(base, path)
    db = Database(path)
    for sql in statements:
        db.execute(sql)
    db.conn.commit()
    db.close()
    return path


def _rows(path: Path) -> tuple[str, list[dict[str, Any]]]:
    with open_ledger(path, create=False) as db:
        run_id = db.require_run(None)["id"]
    db = Database(path)
    rows = list(db.query(
        "select r.*, coalesce(nullif(r.level, ''), 'main') as label, c.complexity as case_complexity "
        "from requests r join runs u on u.id = r.run_id join cases c on c.id = r.case_id "
        "and c.dataset_hash = u.dataset_hash where r.run_id = ? and r.is_warmup = 0 and r.final = 1 "
        "order by r.seq, r.id", [run_id]))
    grades = defaultdict(dict)
    for g in db.query("select * from grade_latest where run_id = ?", [run_id]):
        grades[g["request_id"]][g["grader"]] = g["passed"]
    db.close()
    for r in rows:
        r["quality"] = grades.get(r["id"], {})
    return run_id, rows


def _reference(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, float]]]:
    """variant -> (case, repeat) -> its latencies at concurrency 1, by the definition."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["label"])].append(r)
    out: dict[str, dict[tuple[str, int], dict[str, float]]] = {}
    for (v, label), rs in groups.items():
        closed_one = max(r["concurrency"] or 1 for r in rs) == 1 and all(r["scheduled_ms"] is None for r in rs)
        if closed_one and (label == "c=1" or v not in out):
            out[v] = {(r["case_id"], r["repeat"]): {k: r[f"{k}_ms"] for k in SLO_KEYS if r[f"{k}_ms"] is not None}
                      for r in rs if r["error_class"] is None}
    return out


def _slowdown(r: dict[str, Any], ref: dict[tuple[str, int], dict[str, float]], k: str) -> float | None:
    base = (ref.get((r["case_id"], r["repeat"])) or ref.get((r["case_id"], 0)) or {}).get(k)
    if r["error_class"] is None and r[f"{k}_ms"] is not None and base:
        return r[f"{k}_ms"] / base
    return None


def _peak(rs: list[dict[str, Any]]) -> int:
    total = 0
    for rep in {r["replica"] for r in rs}:
        events = sorted(e for r in rs if r["replica"] == rep and r["mono_start_ms"] is not None
                        for e in ((r["mono_start_ms"], 1), (r["mono_start_ms"] + (r["e2e_ms"] or 0.0), -1)))
        now = top = 0
        for _, d in events:
            now += d
            top = max(top, now)
        total += top
    return total


def _expected(rows: list[dict[str, Any]], absolute: dict[str, float], relative: dict[str, float]) -> dict:
    refs = _reference(rows)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["label"])].append(r)
    out = {}
    for (v, label), rs in groups.items():
        ok = [r for r in rs if r["error_class"] is None]
        ref = refs.get(v, {})
        slow = {k: [s for r in ok if (s := _slowdown(r, ref, k)) is not None] for k in relative}

        def meets(r: dict[str, Any], ref: dict = ref) -> bool:
            return (r["error_class"] is None
                    and all(r[f"{k}_ms"] is not None and r[f"{k}_ms"] <= lim for k, lim in absolute.items())
                    and all((s := _slowdown(r, ref, k)) is not None and s <= f for k, f in relative.items()))

        passes = [all(r["quality"][g] for g in QUALITY_GRADERS if r["quality"].get(g) is not None)
                  for r in ok if any(r["quality"].get(g) is not None for g in QUALITY_GRADERS)]
        tps = [r["completion_tokens"] / (r["e2e_ms"] / 1000.0) for r in ok if r["completion_tokens"] and r["e2e_ms"]]
        out[(v, label)] = {
            "n": len(rs), "errors": len(rs) - len(ok), "concurrency": max(r["concurrency"] or 1 for r in rs),
            "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
            "output_tokens": sum(r["completion_tokens"] or 0 for r in ok),
            "kv_peak": max((r["srv_kv_cache_usage_peak"] for r in rs if r["srv_kv_cache_usage_peak"] is not None),
                           default=None),
            "busy_ms": sum(r["e2e_ms"] or 0.0 for r in rs if r["mono_start_ms"] is not None),
            "in_flight_peak": _peak(rs),
            **{f"p99_{k}": _percentile([r[f"{k}_ms"] for r in ok if r[f"{k}_ms"] is not None], 99) for k in absolute},
            **{f"slow_p99_{k}": _percentile(xs, 99) for k, xs in slow.items()},
            "good": sum(meets(r) for r in rs),
            "quality_n": len(passes), "quality_pass": sum(passes),
            "tps_per_user": sum(tps) / len(tps) if tps else None,
        }
    return out


SLOS = [({"ttft": 1500.0, "e2e": 15000.0}, {}), ({}, {"ttft": 3.0, "e2e": 1.5}),
        ({"tpot": 70.0}, {"tpot": 1.2, "ttft": 2.0})]


@pytest.fixture(scope="module", params=SLOS, ids=["absolute", "relative", "both"])
def levels(shaped: Path, request: pytest.FixtureRequest) -> tuple[list[dict], dict]:
    absolute, relative = request.param
    run_id, rows = _rows(shaped)
    with open_ledger(shaped, create=False) as db:
        got = db.level_table(run_id, absolute, relative, QUALITY_GRADERS)
    return got, _expected(rows, absolute, relative)


FIGURES = ["n", "errors", "concurrency", "prompt_tokens", "output_tokens", "kv_peak", "busy_ms", "in_flight_peak",
           "good", "quality_n", "quality_pass", "tps_per_user"]


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_there_is_a_row_per_variant_and_level_label(levels):
    got, want = levels
    assert sorted((x["variant"], x["label"]) for x in got) == sorted(want)


@pytest.mark.parametrize("figure", FIGURES)
def test_each_level_s_figure_is_its_plain_computation(levels, figure):
    got, want = levels
    assert {(x["variant"], x["label"]): x[figure] for x in got} == pytest.approx(
        {k: w[figure] for k, w in want.items()}, rel=1e-9, nan_ok=False)


def test_each_slo_s_p99_is_its_plain_computation(levels):
    got, want = levels
    keys = [k for k in want[next(iter(want))] if k.startswith(("p99_", "slow_p99_"))]
    bad = [(x["variant"], x["label"], k, x[k], want[(x["variant"], x["label"])][k]) for x in got for k in keys
           if not _close(x[k], want[(x["variant"], x["label"])][k])]
    assert not bad


def test_levels_come_in_the_order_the_rows_first_show_them(levels):
    got, _ = levels
    firsts = [(x["first_seq"], x["first_id"]) for x in got]
    assert firsts == sorted(firsts)


def test_two_servers_clocks_are_counted_apart_and_summed(shaped):
    run_id, rows = _rows(shaped)
    with open_ledger(shaped, create=False) as db:
        got = {(x["variant"], x["label"]): x["in_flight_peak"] for x in db.level_table(run_id, {}, {}, QUALITY_GRADERS)}
    one_clock = [dict(r, replica=0) for r in rows if r["variant"] == "base" and r["label"] == "c=1"]
    assert got[("base", "c=1")] == 2 and _peak(one_clock) == 1  # sequential on each server: one each


def _reshaped(shaped: Path, path: Path, sql: str) -> Path:
    """A copy of the shaped ledger with one more change."""
    return shaped_copy(shaped, path, [sql])


def test_a_relative_slo_falls_back_to_the_first_closed_loop_level_of_one(shaped, tmp_path):
    path = _reshaped(shaped, tmp_path / "renamed.db", "update requests set level = 'unloaded' where level = 'c=1'")
    run_id, rows = _rows(path)
    with open_ledger(path, create=False) as led:
        got = {(x["variant"], x["label"]): x["slow_p99_e2e"] for x in led.level_table(run_id, {}, {"e2e": 2.0}, ())}
    want = _expected(rows, {}, {"e2e": 2.0})
    assert got[("w8a8", "c=4")] == pytest.approx(want[("w8a8", "c=4")]["slow_p99_e2e"], rel=1e-9)


def test_an_open_loop_level_of_one_is_no_reference(shaped, tmp_path):
    path = _reshaped(shaped, tmp_path / "open.db",
                     "update requests set scheduled_ms = mono_start_ms where level = 'c=1' and variant = 'w8a8'")
    run_id, _ = _rows(path)
    with open_ledger(path, create=False) as led:
        got = {(x["variant"], x["label"]): x for x in led.level_table(run_id, {}, {"e2e": 2.0}, ())}
    assert got[("w8a8", "c=4")]["good"] == 0
    assert got[("w8a8", "c=4")]["slow_p99_e2e"] is None
    assert got[("base", "c=4")]["good"] > 0


def test_usage_is_its_plain_computation(shaped):
    run_id, rows = _rows(shaped)
    with open_ledger(shaped, create=False) as db:
        got = db.level_usage(run_id, 0.2)
    for v in ("base", "w8a8"):
        mine = [r for r in rows if r["variant"] == v]
        prompt: dict[str, list[int]] = {}
        for r in mine:
            if r["prompt_tokens"] and r["case_complexity"] in ("short", "medium", "long"):
                acc = prompt.setdefault(r["case_complexity"], [0, 0])
                acc[0] += r["prompt_tokens"]
                acc[1] += 1
        saturated = {r["concurrency"] for r in mine
                     if (r["srv_kv_cache_usage_peak"] or 0) >= 0.2 or (r["srv_preemptions"] or 0) > 0}
        assert got[v] == {"prompt": prompt, "saturated": saturated, "tested": max(r["concurrency"] or 1 for r in mine)}


def test_traffic_sums_are_their_plain_computation(shaped):
    run_id, rows = _rows(shaped)
    with open_ledger(shaped, create=False) as db:
        prefix, convs = db.traffic_sums(run_id)
    want_prefix, want_convs = {}, {}
    for v in dict.fromkeys(r["variant"] for r in rows):
        ok = [r for r in rows if r["variant"] == v and r["error_class"] is None and r["prompt_tokens"]]
        designed = [r for r in ok if r["designed_shared_tokens"] is not None]
        cached = [r for r in ok if r["cached_prompt_tokens"] is not None]
        want_prefix[v] = [len(designed), sum(r["designed_shared_tokens"] for r in designed),
                          sum(r["prompt_tokens"] for r in designed), len(cached),
                          int(any(r["cached_prompt_tokens"] for r in cached)),
                          sum(r["cached_prompt_tokens"] for r in cached), sum(r["prompt_tokens"] for r in cached)]
        turns = [r for r in rows if r["variant"] == v and r["conversation_id"]]
        done: dict[tuple[str, int], bool] = {}
        for r in turns:
            done[(r["conversation_id"], r["repeat"])] = done.get((r["conversation_id"], r["repeat"]), True) \
                and r["error_class"] is None
        want_convs[v] = [len(done), sum(done.values()), len(turns), sum(r["error_class"] is not None for r in turns)]
    assert prefix == want_prefix
    assert convs == want_convs


@pytest.mark.parametrize("cap", [7, 4096])
def test_a_level_s_stop_rule_view_is_the_one_fed_its_rows_in_send_order(shaped, monkeypatch, cap):
    """What over-saturation reads of each level from the ledger (`level_series`: its counts, the
    points `thinned` keeps) is what `LevelOutcome` holds after being fed the level's rows
    in send order: the same points (thinned at a small cap too), KV peak and summed preemptions."""
    from evalkit.execution import stops

    monkeypatch.setattr(stops, "SERIES_CAP", cap)
    run_id, rows = _rows(shaped)
    with open_ledger(shaped, create=False) as db:
        counts, points = db.level_series(run_id, stops.thinned)
    want = {}
    for r in rows:
        want.setdefault((r["variant"], r["label"]), stops.LevelOutcome(keep_latencies=False, keep_cases=False)).add(r)
    assert sorted(counts) == sorted(want)
    assert {k: [stops.Point(*p) for p in points.get(k, [])] for k in want} == {k: o.series for k, o in want.items()}
    assert {k: c["kv_peak"] for k, c in counts.items()} == {k: o.kv_peak for k, o in want.items()}
    assert {k: c["preemptions_summed"] for k, c in counts.items()} == {k: o.preemptions_summed for k, o in want.items()}
