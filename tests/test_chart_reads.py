"""The charts' series from the ledger's queries (`Ledger.chart_series`, issue 48 item 1) equal their
definitions over every row: a CDF's ranks, a level's p99, bands per bin of x and per value of x,
the spikes circled, and KL per answer token. (The drawn charts are held by the known answers in
tests/test_report_golden.py; these hold the roads those files do not reach: a CDF past its
points, bands of a chosen bin count, and KL, which the synthesized run has no grades of.)"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from evalkit.ledger import copy_ledger, open_ledger
from evalkit.ledger.chart_reads import Bands
from evalkit.reporting.rows import request_rows
from evalkit.stats import percentile

from .report_golden import close, synth

VARIANTS = ["base", "w8a8", "fp8"]


@pytest.fixture(scope="module")
def synth_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("charts") / "synth.db"
    return path, synth().synthesize(path, 3000, VARIANTS, [1, 4], seed=11)["run_id"]


def _series(db: Any, run_id: str, most: int = 50, bins: int = 7, spiked: list[int] | None = None,
            min_cases: int = 3) -> Any:
    return db.chart_series(run_id, VARIANTS, spiked or [], {"formality": "formality"}, True, most, bins, min_cases)


def _ok(db: Any, run_id: str) -> list[Any]:
    return [r for r in request_rows(db, run_id) if r["error_class"] is None]


def test_a_cdf_past_its_points_is_drawn_through_the_values_at_evenly_spaced_ranks(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        got = _series(db, run_id).cdf
        rows = _ok(db, run_id)
    want = {}
    for v in VARIANTS:
        for cx in ("short", "medium", "long"):
            xs = sorted(r["ttft_ms"] for r in rows if r["variant"] == v and r["complexity"] == cx and r["ttft_ms"] is not None)
            n = len(xs)
            idx = sorted({0, n - 1, *(round(k * (n - 1) / 50) for k in range(51))}) if n > 50 else range(n)
            want[(v, cx)] = (n, [(i, xs[i]) for i in idx])
    assert got == want


def test_a_small_cdf_is_every_value(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        n, ranked = _series(db, run_id, most=10**6).cdf[("w8a8", "long")]
    assert [i for i, _ in ranked] == list(range(n))


def test_the_ttft_p99_of_each_level_is_its_percentile(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        got = _series(db, run_id).p99
        rows = _ok(db, run_id)
    want = {(v, lab): percentile([r["ttft_ms"] for r in rows if r["variant"] == v and (r["level"] or "main") == lab], 99)
            for v, lab in sorted({(r["variant"], r["level"] or "main") for r in rows})}
    assert close(dict(sorted(got.items())), want) == []


def _bands(points: dict[str, list[tuple[float, float]]], bins: int) -> dict[str, list[tuple[float, ...]]]:
    """Bands by definition: x's own values where it has at most ``bins``, else equal widths."""
    xs = [x for pts in points.values() for x, _ in pts]
    lo, hi = min(xs), max(xs)
    by_value = len(set(xs)) <= bins
    width = (hi - lo) / bins or 1.0
    out = {}
    for v, pts in points.items():
        by: dict[float, list[float]] = defaultdict(list)
        for x, y in pts:
            by[x if by_value else min(bins - 1, int((x - lo) / width))].append(y)
        out[v] = [(b if by_value else lo + (b + 0.5) * width, *(percentile(ys, q) for q in (10, 50, 90)))
                  for b, ys in sorted(by.items())]
    return out


def test_bands_of_prompt_tokens_are_percentiles_per_bin_of_equal_width(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        got = _series(db, run_id).tok
        rows = _ok(db, run_id)
    pts = {v: [(r["prompt_tokens"], r["ttft_ms"]) for r in rows if r["variant"] == v and r["prompt_tokens"]
               and r["ttft_ms"] is not None] for v in VARIANTS}
    assert isinstance(got, Bands)
    assert got.values is False
    assert got.n == sum(map(len, pts.values()))
    assert close(got.rows, _bands(pts, 7)) == []


def test_bands_of_a_level_are_percentiles_per_level(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        got = _series(db, run_id).scatter["formality"]
        rows = _ok(db, run_id)
    pts = {v: [(r["formality"], r["grades"]["formality"]["value"]) for r in rows if r["variant"] == v
               and "formality" in r["grades"] and r["grades"]["formality"]["value"] is not None] for v in VARIANTS}
    assert isinstance(got, Bands)
    assert got.values is True
    assert close(got.rows, _bands(pts, 7)) == []


def test_the_percentiles_a_batch_of_groups_at_a_time_equal_them_all_at_once(synth_ledger, monkeypatch):
    """The boxes, the levels' p99 and the bands with every group a batch of its own (`PerGroup`, as
    at 10 M rows) are the figures of one statement over every group."""
    from evalkit.ledger import duck

    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        whole = _series(db, run_id)
        monkeypatch.setattr(duck, "BATCH_VALUES", 1)
        got = _series(db, run_id)
    assert (got.boxes, got.p99, got.tok, got.scatter) == (whole.boxes, whole.p99, whole.tok, whole.scatter)


def test_a_small_scatter_is_its_points_in_the_rows_order(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        got = _series(db, run_id, most=10**6).scatter["formality"]
        rows = _ok(db, run_id)
    assert got["fp8"] == [(r["formality"], r["grades"]["formality"]["value"]) for r in rows
                          if r["variant"] == "fp8" and "formality" in r["grades"]]


def test_the_spikes_circled_are_their_prompt_tokens_and_ttft_in_the_rows_order(synth_ledger):
    path, run_id = synth_ledger
    with open_ledger(path, create=False) as db:
        rows = _ok(db, run_id)
        spiked = [r["id"] for r in rows[::97]][::-1]  # any order given: drawn in the rows'
        got = _series(db, run_id, spiked=spiked).marked
    assert got == [(r["prompt_tokens"], r["ttft_ms"]) for r in rows if r["id"] in set(spiked) and r["prompt_tokens"]]


def _kl_along(rows: list[Any], least: int) -> dict[str, list[tuple[float, float]]]:
    """KL along the answer by definition: per series (the variant, or its floor) and answer token,
    the mean over the successful answers reaching it, where ``least`` do; series in their first row's order."""
    acc: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        d = (r["grades"].get("divergence") or {}).get("detail") or {}
        if d.get("status") != "ok" or not d.get("kl_tokens"):
            continue
        name = f"{r['variant']} (floor)" if d.get("kind") == "floor" else r["variant"]
        for i, x in enumerate(d["kl_tokens"]):
            acc.setdefault(name, defaultdict(list))[i].append(x)
    return {name: [(float(i), sum(xs) / len(xs)) for i, xs in sorted(pos.items()) if len(xs) >= least]
            for name, pos in acc.items()}


def test_kl_along_the_answer_is_the_mean_per_token_over_the_answers_reaching_it(synth_ledger, tmp_path):
    path, run_id = synth_ledger
    db = open_ledger(copy_ledger(path, tmp_path / "kl.db"), create=False)
    ids = [(i, v) for i, v in db._db.execute("select id, variant from requests where run_id = ? order by seq, id",
                                             [run_id]).fetchall()][:400]
    grades = []
    for k, (i, v) in enumerate(ids):
        status = "skipped" if k % 11 == 0 else "ok"
        kl = [0.1 * (k % 7) + 0.01 * j for j in range(k % 9)]  # some empty, some long
        grades.append({"request_id": i, "run_id": run_id, "grader": "divergence", "grader_version": "1",
                       "value": None, "passed": None, "created_at": "2026-12-07T00:00:00Z",
                       "detail_json": json.dumps({"status": status, "kind": "floor" if v == "base" and k % 3 else
                                                  "candidate", "kl_tokens": kl})})
    db.insert_grades(grades)
    db._db.conn.commit()
    got = _series(db, run_id, min_cases=4).kl
    rows = _ok(db, run_id)
    db.close()
    want = _kl_along(rows, 4)
    assert list(got) == [n for n in dict.fromkeys(
        (f"{r['variant']} (floor)" if r["grades"]["divergence"]["detail"].get("kind") == "floor" else r["variant"])
        for r in rows if "divergence" in r["grades"] and r["grades"]["divergence"]["detail"]["status"] == "ok"
        and r["grades"]["divergence"]["detail"]["kl_tokens"]) if n in want]
    assert close(got, want) == []
