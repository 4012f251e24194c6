"""Per variant x complexity: latency distribution, schema pass rate, delta against the baseline."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from sqlite_utils import Database

from .dataset import COMPLEXITIES
from .errors import UsageError
from .stats import bootstrap_ci, mean, pct_delta, percentile, verdict

SLICES = (*COMPLEXITIES, "all")


def latest_grades(db: Database, run_id: str) -> dict[int, dict[str, dict[str, Any]]]:
    """request id -> grader -> its newest grade row (re-grading adds rows; the newest counts)."""
    out: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for g in db.query(
        """select g.request_id, g.grader, g.value, g.passed, g.detail_json from grades g
           join (select max(id) as id from grades where run_id = ? group by request_id, grader) m on m.id = g.id""",
        [run_id],
    ):
        g["detail"] = json.loads(g.pop("detail_json") or "{}")
        out[g["request_id"]][g["grader"]] = g
    return out


def quality(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Quality aggregates over rows carrying their newest grades (failed requests have none)."""
    schema = [r["grades"]["schema"]["passed"] for r in rows if "schema" in r["grades"]]
    persona = [r["grades"]["persona"] for r in rows if "persona" in r["grades"]]
    form = [r["grades"]["formality"]["detail"] for r in rows if "formality" in r["grades"]]
    return {
        "schema_pass_pct": 100.0 * sum(schema) / len(schema) if schema else None,
        "schema_graded": len(schema),
        "persona_score": mean([p["value"] for p in persona]),
        "persona_pass_pct": 100.0 * sum(p["passed"] for p in persona) / len(persona) if persona else None,
        "formality_mae": mean([abs(f["error"]) for f in form]),
        "formality_within1_pct": 100.0 * sum(abs(f["error"]) <= 1 for f in form) / len(form) if form else None,
        "formality_n": len(form),
    }


def _per_case_drift(rows: list[dict[str, Any]], kind: str) -> dict[str, float]:
    """case -> mean drift (1 - cosine) of that kind of pair."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        d = r["grades"].get("drift", {}).get("detail", {})
        if d.get("kind") == kind:
            acc[r["case_id"]].append(d["drift"])
    return {k: sum(v) / len(v) for k, v in acc.items()}


def drift_vs_floor(rows: list[dict[str, Any]], base_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Drift next to the baseline's own noise floor, paired by case, with a bootstrap CI."""
    drift, floor = _per_case_drift(rows, "drift"), _per_case_drift(base_rows, "noise_floor")
    paired = sorted(set(drift) & set(floor))
    diffs = [drift[c] - floor[c] for c in paired]
    ci = bootstrap_ci(diffs)
    return {
        "drift_mean": mean(list(drift.values())), "floor_mean": mean(list(floor.values())),
        "drift_minus_floor": mean(diffs), "drift_minus_floor_ci95": list(ci) if ci else None,
        "drift_pairs": len(paired),
        "drift_verdict": verdict(ci, "drift above the noise floor", "drift below the noise floor",
                                 "within the noise floor") if drift else None,
    }


def latest_run_id(db: Database) -> str:
    row = next(db.query("select id from runs order by created_at desc limit 1"), None)
    if row is None:
        raise UsageError("the ledger has no runs yet: run `evalkit run` first")
    return row["id"]


def _meets(r: dict[str, Any], slo: dict[str, float]) -> bool:
    """A request counts towards goodput when it succeeded and met every SLO given."""
    if r["error_class"] is not None:
        return False
    return all(r[f"{k}_ms"] is not None and r[f"{k}_ms"] <= v for k, v in slo.items())


def _slice_stats(rows: list[dict[str, Any]], slo: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in rows if r["error_class"] is None]
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    e2e = [r["e2e_ms"] for r in ok if r["e2e_ms"] is not None]
    return {
        "n": len(rows),
        "n_errors": len(rows) - len(ok),
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p90_ms": percentile(ttft, 90),
        "ttft_p99_ms": percentile(ttft, 99), "ttft_max_ms": max(ttft) if ttft else None,
        "e2e_mean_ms": mean(e2e), "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
        "completion_tokens_mean": mean([r["completion_tokens"] for r in ok if r["completion_tokens"] is not None]),
        "tpot_p50_ms": percentile([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None], 50),
        "itl_p50_ms": percentile([r["itl_mean_ms"] for r in ok if r["itl_mean_ms"] is not None], 50),
        "goodput_pct": 100.0 * sum(_meets(r, slo) for r in rows) / len(rows) if slo and rows else None,
        # what the server says happened (per-request histogram deltas or window means)
        "srv_queue_p50_ms": percentile([r["srv_queue_ms"] for r in ok if r["srv_queue_ms"] is not None], 50),
        "srv_prefill_p50_ms": percentile([r["srv_prefill_ms"] for r in ok if r["srv_prefill_ms"] is not None], 50),
        "srv_decode_p50_ms": percentile([r["srv_decode_ms"] for r in ok if r["srv_decode_ms"] is not None], 50),
        "srv_ttft_p50_ms": percentile([r["srv_ttft_ms"] for r in ok if r["srv_ttft_ms"] is not None], 50),
        "kv_peak_pct": (100.0 * max(kv) if (kv := [r["srv_kv_cache_usage_peak"] for r in rows
                                                   if r["srv_kv_cache_usage_peak"] is not None]) else None),
        "preemptions": (sum(p) if (p := [r["srv_preemptions"] for r in rows if r["srv_preemptions"] is not None])
                        else None),
        "srv_methods": sorted({r["srv_method"] for r in rows if r["srv_method"]}),
    }


def build_report(db: Database, run_id: str | None = None, slo: dict[str, float] | None = None) -> dict[str, Any]:
    run_id = run_id or latest_run_id(db)
    run = db["runs"].get(run_id) if db["runs"].count_where("id = ?", [run_id]) else None
    if run is None:
        raise UsageError(f"no run '{run_id}' in the ledger")
    variants = list(db.query("select * from variants where run_id = ? order by rowid", [run_id]))
    rows = list(db.query(
        """select r.id, r.variant, r.case_id, r.ttft_ms, r.e2e_ms, r.tpot_ms, r.itl_mean_ms, r.completion_tokens,
                  r.error_class, r.srv_method, r.srv_queue_ms, r.srv_prefill_ms, r.srv_decode_ms, r.srv_ttft_ms,
                  r.srv_kv_cache_usage_peak, r.srv_preemptions, c.complexity
           from requests r join runs u on u.id = r.run_id
           join cases c on c.id = r.case_id and c.dataset_hash = u.dataset_hash
           where r.run_id = ? and r.is_warmup = 0 and r.final = 1""",
        [run_id],
    ))
    grades = latest_grades(db, run_id)
    for r in rows:
        r["grades"] = grades.get(r["id"], {})
    baseline = next((v["name"] for v in variants if v["is_baseline"]), None)
    if slo is None:
        load = json.loads(run["load_json"] or "{}")
        slo = {k: load[f"slo_{k}_ms"] for k in ("ttft", "tpot", "e2e") if load.get(f"slo_{k}_ms") is not None}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["complexity"])].append(r)
        groups[(r["variant"], "all")].append(r)
    table = []
    for v in variants:
        for s in SLICES:
            if (v["name"], s) not in groups:
                continue
            table.append({"variant": v["name"], "complexity": s, **_slice_stats(groups[(v["name"], s)], slo)})
    for r in table:
        slice_rows = groups[(r["variant"], r["complexity"])]
        r.update(quality(slice_rows))
        if r["variant"] == baseline:
            r.update(drift_vs_floor([], slice_rows))
        else:
            r.update(drift_vs_floor(slice_rows, groups.get((baseline, r["complexity"]), [])))
    base_rows = {r["complexity"]: r for r in table if r["variant"] == baseline}
    for r in table:
        b = base_rows.get(r["complexity"])
        r["ttft_p50_delta_pct"] = pct_delta(r["ttft_p50_ms"], b and b["ttft_p50_ms"])
        r["e2e_mean_delta_pct"] = pct_delta(r["e2e_mean_ms"], b and b["e2e_mean_ms"])
        r["schema_pass_delta_pp"] = (
            r["schema_pass_pct"] - b["schema_pass_pct"]
            if b and r["schema_pass_pct"] is not None and b["schema_pass_pct"] is not None else None
        )
    return {
        "run": {k: run[k] for k in ("id", "created_at", "finished_at", "status", "matrix_name",
                                    "dataset_hash", "n_cases", "evalkit_version")},
        "baseline": baseline,
        "slo_ms": slo,
        "load": json.loads(run["load_json"] or "{}"),
        "variants": [{k: v[k] for k in ("name", "is_baseline", "model", "engine", "engine_version", "quantization",
                                        "status", "error", "ready_s", "metrics_available")} for v in variants],
        "rows": table,
    }


def _fmt(x: Any, digits: int = 0, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.{digits}f}" if signed else f"{x:,.{digits}f}"


COLUMNS = [
    ("variant", "variant", None), ("complexity", "slice", None), ("n", "n", None),
    ("n_errors", "err", None), ("ttft_p50_ms", "TTFT p50", 0), ("ttft_p90_ms", "p90", 0),
    ("ttft_p99_ms", "p99", 0), ("ttft_max_ms", "max", 0), ("e2e_mean_ms", "E2E mean", 0),
    ("e2e_p50_ms", "p50", 0), ("e2e_p99_ms", "p99", 0), ("schema_pass_pct", "schema %", 0),
    ("ttft_p50_delta_pct", "ΔTTFT p50 %", 1), ("e2e_mean_delta_pct", "ΔE2E mean %", 1),
]


SERVER_COLUMNS = [
    ("variant", "variant", None), ("complexity", "slice", None), ("ttft_p50_ms", "client TTFT p50", 0),
    ("srv_ttft_p50_ms", "server TTFT p50", 0), ("srv_queue_p50_ms", "queue p50", 0),
    ("srv_prefill_p50_ms", "prefill p50", 0), ("srv_decode_p50_ms", "decode p50", 0),
    ("tpot_p50_ms", "TPOT p50", 1), ("kv_peak_pct", "KV peak %", 1), ("preemptions", "preempt", 0),
    ("goodput_pct", "goodput %", 0),
]


QUALITY_COLUMNS = [
    ("variant", "variant", None), ("complexity", "slice", None), ("schema_pass_pct", "schema %", 0),
    ("persona_score", "persona score", 2), ("persona_pass_pct", "persona pass %", 0),
    ("formality_mae", "formality MAE", 2), ("formality_within1_pct", "formality ±1 %", 0),
    ("drift_mean", "drift", 3), ("floor_mean", "noise floor", 3), ("drift_minus_floor", "drift − floor", 3),
    ("drift_minus_floor_ci95", "95% CI", 3), ("drift_verdict", "verdict", None),
]


def table_cells(report: dict[str, Any], columns: list | None = None) -> tuple[list[str], list[list[str]]]:
    columns = columns or COLUMNS
    header = [h for _, h, _ in columns]
    body = []
    for r in report["rows"]:
        cells = []
        for key, _, d in columns:
            v = r.get(key)
            if isinstance(v, list) and len(v) == 2:
                cells.append(f"[{v[0]:+.{d}f}, {v[1]:+.{d}f}]")
            elif d is None:
                cells.append("-" if v is None else str(v))
            else:
                cells.append(_fmt(v, d, signed=key.endswith("_pct") and "delta" in key))
        body.append(cells)
    return header, body


def markdown_table(report: dict[str, Any], columns: list | None = None) -> str:
    header, body = table_cells(report, columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False)
