"""Findings computed from the ledger: distributions per slice, paired comparisons against the
baseline with bootstrap intervals, spikes and their attribution, capacity, SLO recommendations,
and the study-style summary. Everything here reads rows; nothing is measured again."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from ..errors import UsageError
from ..grading.registry import available
from ..ledger import Ledger
from ..stats import bootstrap_ci, mean, percentile, verdict
from .report import quality

LATENCY_FIELDS = ("ttft_ms", "tpot_ms", "itl_mean_ms", "e2e_ms", "out_tps")
SLICE_FIELDS = ("complexity", "persona", "formality", "task", "candidate", "replica", "phase", "concurrency")


def describe(values: list[float]) -> dict[str, float | None]:
    xs = [v for v in values if v is not None]
    n = len(xs)
    m = mean(xs)
    std = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 and m is not None else None
    return {"n": n, "mean": m, "std": std, "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p95": percentile(xs, 95), "p99": percentile(xs, 99), "max": max(xs) if xs else None}


def request_rows(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """Measured requests (non-warmup, final attempt) joined with their case and latest grades."""
    rows = ledger.measured_requests(run_id)
    grades = ledger.latest_grades(run_id)
    for r in rows:
        r["grades"] = grades.get(r["id"], {})
        r["out_tps"] = (r["completion_tokens"] / (r["e2e_ms"] / 1000.0)
                        if r["completion_tokens"] and r["e2e_ms"] and r["error_class"] is None else None)
    return rows


def slices(rows: list[dict[str, Any]], by: list[str]) -> list[dict[str, Any]]:
    """Distribution of every metric per variant x slice (any combination of case fields)."""
    bad = [b for b in by if b not in SLICE_FIELDS]
    if bad:
        raise UsageError(f"--by: unknown slice field(s) {', '.join(bad)} (known: {', '.join(SLICE_FIELDS)})")
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], *(r[b] for b in by))].append(r)
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        ok = [r for r in rs if r["error_class"] is None]
        entry: dict[str, Any] = {"variant": key[0], **dict(zip(by, key[1:], strict=True)), "n": len(rs),
                                 "errors": len(rs) - len(ok)}
        for m in LATENCY_FIELDS:
            entry[m] = describe([r[m] for r in ok])
        entry.update(quality(ok))
        out.append(entry)
    return out


def paired(rows: list[dict[str, Any]], baseline: str, metric: str, by: str = "complexity") -> list[dict[str, Any]]:
    """Candidate minus baseline on the same case and repeat, per slice, with a bootstrap CI of the
    mean difference and a verdict only where the interval excludes 0."""
    index = {(r["variant"], r["case_id"], r["repeat"]): r for r in rows if r["error_class"] is None}
    out = []
    variants = sorted({r["variant"] for r in rows} - {baseline})
    for v in variants:
        groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for (var, case, rep), r in index.items():
            b = index.get((baseline, case, rep))
            if var != v or b is None or r[metric] is None or b[metric] is None:
                continue
            groups[str(r[by])].append((r[metric], b[metric]))
            groups["all"].append((r[metric], b[metric]))
        for s, pairs in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])):
            diffs = [a - b for a, b in pairs]
            base_mean = mean([b for _, b in pairs])
            ci = bootstrap_ci(diffs)
            out.append({
                "variant": v, by: s, "metric": metric, "pairs": len(pairs), "baseline_mean": base_mean,
                "variant_mean": mean([a for a, _ in pairs]), "delta": mean(diffs),
                "delta_pct": 100 * mean(diffs) / base_mean if base_mean else None,
                "ci95": list(ci) if ci else None,
                "ci95_pct": [100 * c / base_mean for c in ci] if ci and base_mean else None,
                "verdict": verdict(ci, f"{v} slower" if metric != "out_tps" else f"{v} faster",
                                   f"{v} faster" if metric != "out_tps" else f"{v} slower", "no clear difference"),
            })
    return out


# --- spikes ---------------------------------------------------------------------------------------


def mad(xs: list[float]) -> float:
    m = percentile(xs, 50) or 0.0
    return percentile([abs(x - m) for x in xs], 50) or 0.0


def find_spikes(values: list[float], k: float = 3.5) -> list[int]:
    """Indices of values above median + k * 1.4826 * MAD (a robust z-score over k). The scale is
    floored at 1 % of the median, so identical values do not make every wiggle a spike."""
    if len(values) < 5:
        return []
    med = percentile(values, 50) or 0.0
    scale = max(1.4826 * mad(values), 0.01 * abs(med), 1e-9)
    return [i for i, v in enumerate(values) if v > med + k * scale]


def attribute_spike(r: dict[str, Any], slice_rows: list[dict[str, Any]], metric: str,
                    first_seq: int | None) -> tuple[str, str]:
    """Why was this request slow? queued, cold/long prefill, preemption, or unexplained."""
    med = percentile([x[metric] for x in slice_rows if x[metric] is not None], 50) or 0.0
    excess = (r[metric] or 0.0) - med
    prefill_med = percentile([x["srv_prefill_ms"] for x in slice_rows if x["srv_prefill_ms"] is not None], 50)
    if (r["srv_preemptions"] or 0) > 0:
        return "preemption", f"{r['srv_preemptions']:.0f} preemption(s) during the request"
    if r["srv_queue_ms"] is not None and r["srv_queue_ms"] >= 0.5 * excess:
        return "queued", f"server queue {r['srv_queue_ms']:.0f} ms (waiting at start: {r['srv_waiting_start']})"
    if r["srv_prefill_ms"] is not None and prefill_med is not None and r["srv_prefill_ms"] - prefill_med >= 0.5 * excess:
        cold = " (first measured request on this server)" if r["seq"] == first_seq else ""
        return "cold/long prefill", (f"server prefill {r['srv_prefill_ms']:.0f} ms vs slice median "
                                     f"{prefill_med:.0f} ms{cold}")
    if r["seq"] == first_seq:
        return "cold/long prefill", "first measured request on this server"
    running, waiting = r.get("srv_running_start") or 0, r.get("srv_waiting_start") or 0
    if running >= 1 or waiting >= 1:
        return "contention", f"{running:.0f} request(s) running and {waiting:.0f} waiting when it started"
    if r["srv_method"] is None:
        return "unexplained", "no server telemetry for this request"
    return "unexplained", "queue, prefill and preemptions were all normal"


def spikes(rows: list[dict[str, Any]], metric: str = "ttft_ms", k: float = 3.5) -> list[dict[str, Any]]:
    out = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["error_class"] is None and r[metric] is not None:
            groups[(r["variant"], r["complexity"])].append(r)
    firsts = {v: min(r["seq"] for r in rows if r["variant"] == v) for v in {r["variant"] for r in rows}}
    for (v, cx), rs in sorted(groups.items()):
        vals = [r[metric] for r in rs]
        med = percentile(vals, 50) or 0.0
        scale = max(1.4826 * mad(vals), 0.01 * abs(med), 1e-9)
        for i in find_spikes(vals, k):
            r = rs[i]
            cause, why = attribute_spike(r, rs, metric, firsts[v])
            out.append({"request_id": r["id"], "variant": v, "complexity": cx, "case_id": r["case_id"],
                        "metric": metric, "value": r[metric], "slice_median": med,
                        "robust_z": (r[metric] - med) / scale, "cause": cause, "evidence": why,
                        "line": f"{v} {cx} {r['case_id']}: {metric.removesuffix('_ms').upper()} {r[metric]:,.0f} ms "
                                f"(slice median {med:,.0f} ms, robust z {(r[metric] - med) / scale:.1f}): "
                                f"{cause}: {why}"})
    return out


# --- capacity, SLOs, summary ---------------------------------------------------------------------


def capacity(variants: list[dict[str, Any]], rows: list[dict[str, Any]], max_tokens: int,
             stop_kv: float = 0.9) -> list[dict[str, Any]]:
    """Max concurrent sequences the engine's KV cache holds at the dataset's lengths, next to the
    measured saturation point of a sweep (if any)."""
    out = []
    for v in variants:
        cfg = json.loads(v["cache_config_json"] or "{}")
        try:
            blocks, bs = int(cfg["num_gpu_blocks"]), int(cfg["block_size"])
        except (KeyError, ValueError, TypeError):
            out.append({"variant": v["name"], "kv_tokens": None, "note": "engine did not report cache_config_info"})
            continue
        per = {}
        for cx in ("short", "medium", "long"):
            p = mean([r["prompt_tokens"] for r in rows if r["variant"] == v["name"] and r["complexity"] == cx
                      and r["prompt_tokens"]])
            if p:
                per[cx] = blocks // max(1, math.ceil((p + max_tokens) / bs))
        vrows = [r for r in rows if r["variant"] == v["name"]]
        sat = [r["concurrency"] for r in vrows if (r["srv_kv_cache_usage_peak"] or 0) >= stop_kv
               or (r["srv_preemptions"] or 0) > 0]
        out.append({"variant": v["name"], "kv_tokens": blocks * bs, "block_size": bs, "blocks": blocks,
                    "engine_max_concurrency": cfg.get("kv_cache_max_concurrency"),
                    "max_concurrent_by_complexity": per,
                    "measured_saturation_concurrency": min(sat) if sat else None,
                    "max_concurrency_tested": max((r["concurrency"] or 1) for r in vrows) if vrows else None})
    return out


WORKLOADS = {
    "interactive long-input": lambda r: r["complexity"] == "long",
    "interactive short/medium": lambda r: r["complexity"] in ("short", "medium"),
    "batch (all, throughput)": lambda r: True,
}


def parse_targets(text: str) -> dict[tuple[str, float], float]:
    """`ttft_p99=1500,e2e_p50=8000` -> {("ttft_ms", 99): 1500, ("e2e_ms", 50): 8000}."""
    out: dict[tuple[str, float], float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, val = part.strip().partition("=")
        metric, _, q = key.partition("_p")
        if not eq or metric not in ("ttft", "tpot", "e2e", "itl") or not q.replace(".", "", 1).isdigit():
            raise UsageError(f"--target: '{part}': expected METRIC_pNN=MS with METRIC in ttft, tpot, itl, e2e "
                             "(per-request limits such as ttft=2000 go to --slo)")
        try:
            out[(("itl_mean" if metric == "itl" else metric) + "_ms", float(q))] = float(val)
        except ValueError:
            raise UsageError(f"--target: '{val}' is not a number of milliseconds") from None
    if not out:
        raise UsageError("--target: give at least one goal, e.g. ttft_p99=2000,e2e_p50=10000")
    return out


def recommend(rows: list[dict[str, Any]], targets: dict[tuple[str, float], float]) -> list[dict[str, Any]]:
    """Per workload class: which variants meet every SLO, with a bootstrap interval on each
    percentile so a pass or a miss that is within noise says so."""
    import random

    out = []
    variants = sorted({r["variant"] for r in rows})
    for wl, pick in WORKLOADS.items():
        for v in variants:
            rs = [r for r in rows if r["variant"] == v and pick(r)]
            ok = [r for r in rs if r["error_class"] is None]
            checks = []
            for (metric, q), limit in targets.items():
                xs = [r[metric] for r in ok if r[metric] is not None]
                est = percentile(xs, q)
                rng = random.Random(0)
                boots = sorted(percentile([xs[rng.randrange(len(xs))] for _ in xs], q) for _ in range(500)) if xs else []
                ci = (percentile(boots, 2.5), percentile(boots, 97.5)) if boots else None
                status = ("no data" if est is None else "meets" if ci and ci[1] <= limit else
                          "misses" if ci and ci[0] > limit else "borderline")
                checks.append({"metric": metric, "q": q, "limit_ms": limit, "estimate_ms": est,
                               "ci95_ms": list(ci) if ci else None, "status": status})
            errors = len(rs) - len(ok)
            overall = ("no data" if not ok else "meets" if all(c["status"] == "meets" for c in checks) and not errors
                       else "misses" if any(c["status"] == "misses" for c in checks) else "borderline")
            out.append({"workload": wl, "variant": v, "n": len(rs), "errors": errors, "status": overall,
                        "checks": checks})
    return out


def study_summary(ledger: Ledger, run_id: str, rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """The study's table: TTFT tax by complexity, E2E delta on medium generations, KV-cache
    peak and mean, preemptions, and the quality ledger, for each variant against the baseline."""
    out = []
    ttft = {(p["variant"], p["complexity"]): p for p in paired(rows, baseline, "ttft_ms")}
    e2e = {(p["variant"], p["complexity"]): p for p in paired(rows, baseline, "e2e_ms")}
    for v in sorted({r["variant"] for r in rows}):
        kv = [x["value"] for x in ledger.server_series(run_id, "kv_cache_usage_perc", v)]
        vr = [r for r in rows if r["variant"] == v]
        ok = [r for r in vr if r["error_class"] is None]
        entry: dict[str, Any] = {"variant": v, "is_baseline": v == baseline, "n": len(vr), "errors": len(vr) - len(ok)}
        for cx in ("short", "medium", "long"):
            t = ttft.get((v, cx))
            entry[f"ttft_mean_{cx}_ms"] = mean([r["ttft_ms"] for r in ok if r["complexity"] == cx])
            entry[f"ttft_tax_{cx}_pct"] = t["delta_pct"] if t else None
            entry[f"ttft_tax_{cx}_ci95_pct"] = t["ci95_pct"] if t else None
        m = e2e.get((v, "medium"))
        entry["e2e_mean_medium_ms"] = mean([r["e2e_ms"] for r in ok if r["complexity"] == "medium"])
        entry["e2e_delta_medium_pct"] = m["delta_pct"] if m else None
        entry["e2e_delta_medium_ci95_pct"] = m["ci95_pct"] if m else None
        entry["ttft_max_ms"] = max((r["ttft_ms"] for r in ok), default=None)
        entry["kv_cache_peak_pct"] = 100 * max(kv) if kv else None
        entry["kv_cache_mean_pct"] = 100 * mean(kv) if kv else None
        entry["preemptions"] = ledger.series_delta(run_id, v, "num_preemptions_total") or 0.0
        entry.update(quality(ok, None if v == baseline else [r for r in rows if r["variant"] == baseline
                                                              and r["error_class"] is None]))
        out.append(entry)
    return out


def load_levels(rows: list[dict[str, Any]], load: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant and load level (a sweep's phases, or the one phase): throughput over the level's
    wall time, and whether the level met the run's SLOs (p99 of each at or under its limit, the
    sweep's own rule)."""
    slo = {k: load.get(f"slo_{k}_ms") for k in ("ttft", "tpot", "e2e") if load.get(f"slo_{k}_ms") is not None}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["phase"] or "main")].append(r)
    out = []
    for (v, phase), rs in groups.items():
        ok = [r for r in rs if r["error_class"] is None]
        spans = [(r["mono_start_ms"], r["mono_start_ms"] + (r["e2e_ms"] or 0.0)) for r in rs
                 if r["mono_start_ms"] is not None]
        wall_s = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1000.0 if spans else None
        out_tok = sum(r["completion_tokens"] or 0 for r in ok)
        in_tok = sum(r["prompt_tokens"] or 0 for r in ok)
        p99 = {k: percentile([r[f"{k}_ms"] for r in ok if r[f"{k}_ms"] is not None], 99) for k in slo}
        out.append({
            "variant": v, "phase": phase, "concurrency": max((r["concurrency"] or 1) for r in rs), "n": len(rs),
            "errors": len(rs) - len(ok), "wall_s": wall_s, "prompt_tokens": in_tok, "output_tokens": out_tok,
            "output_tps": out_tok / wall_s if wall_s else None, "requests_per_s": len(ok) / wall_s if wall_s else None,
            "meets_slo": (not (len(rs) - len(ok)) and all(p99[k] is not None and p99[k] <= slo[k] for k in slo))
            if slo else None,
            "goodput_pct": 100.0 * sum(r["error_class"] is None and all(
                r[f"{k}_ms"] is not None and r[f"{k}_ms"] <= slo[k] for k in slo) for r in rs) / len(rs) if slo else None,
        })
    return sorted(out, key=lambda x: (x["variant"], x["concurrency"], x["phase"]))


def cost(variants: list[dict[str, Any]], levels: list[dict[str, Any]], reference: dict[str, Any] | None
         ) -> list[dict[str, Any]]:
    """$ per million output tokens and per 1,000 requests at each measured load level, from the
    variant's price per hour and the throughput it reached there (the machine is assumed busy at
    that level), next to a hosted API's list price for the same tokens (break-even)."""
    price = {v["name"]: json.loads(v["cost_json"])["usd_per_hour"] for v in variants if v.get("cost_json")}
    out = []
    for lv in levels:
        usd_h = price.get(lv["variant"])
        if usd_h is None or not lv["output_tps"] or not lv["requests_per_s"]:
            continue
        usd_s = usd_h / 3600.0
        entry = {**{k: lv[k] for k in ("variant", "phase", "concurrency", "meets_slo", "output_tps", "requests_per_s")},
                 "usd_per_hour": usd_h,
                 "usd_per_m_output_tokens": usd_s / lv["output_tps"] * 1e6,
                 "usd_per_1k_requests": usd_s / lv["requests_per_s"] * 1000.0}
        if reference:
            n_ok = lv["n"] - lv["errors"]
            per_req = (lv["prompt_tokens"] * reference["usd_per_m_input"]
                       + lv["output_tokens"] * reference["usd_per_m_output"]) / 1e6 / max(1, n_ok)
            entry.update({"reference": reference["name"], "reference_usd_per_1k_requests": per_req * 1000.0,
                          "reference_usd_per_m_output_tokens": reference["usd_per_m_output"],
                          "break_even_requests_per_hour": usd_h / per_req if per_req else None,
                          "cheaper_than_reference": entry["usd_per_1k_requests"] < per_req * 1000.0})
        out.append(entry)
    # the highest level that still meets the SLOs (or the highest measured, without SLOs), per variant
    for v in {e["variant"] for e in out}:
        ok = [e for e in out if e["variant"] == v and e["meets_slo"] is not False]
        if ok:
            max(ok, key=lambda e: e["concurrency"])["best_level"] = True
    return out


def findings(ledger: Ledger, run_id: str | None = None, by: list[str] | None = None, k: float = 3.5) -> dict[str, Any]:
    run = ledger.require_run(run_id)
    run_id = run["id"]
    baseline = ledger.baseline(run_id)
    rows = request_rows(ledger, run_id)
    max_tokens = json.loads(run["matrix_json"])["generation"]["max_tokens"]
    load = json.loads(run["load_json"] or "{}")
    stop_kv = load.get("stop_kv", 0.9)
    variants = ledger.variants(run_id)
    levels = load_levels(rows, load)
    return {
        "run_id": run_id, "baseline": baseline,
        "slices": slices(rows, by or ["complexity"]),
        "paired": [p for m in ("ttft_ms", "e2e_ms", "tpot_ms") for p in paired(rows, baseline, m)] if baseline else [],
        "spikes": spikes(rows, "ttft_ms", k) + spikes(rows, "e2e_ms", k),
        "capacity": capacity(variants, rows, max_tokens, stop_kv),
        "load_levels": levels,
        "cost": cost(variants, levels, json.loads(run["matrix_json"]).get("reference_price")),
        "study_summary": study_summary(ledger, run_id, rows, baseline) if baseline else [],
        "notes": [line for cls in available().values() for line in cls.notes(rows)],
    }


def recommend_lines(out: list[dict[str, Any]]) -> list[str]:
    """`recommend`'s answer as text: per workload class, the variants that meet the goals, then
    each variant's evidence."""
    lines = []
    for wl in dict.fromkeys(o["workload"] for o in out):
        rows = [o for o in out if o["workload"] == wl]
        good = [o["variant"] for o in rows if o["status"] == "meets"]
        lines.append(f"{wl}: " + (f"use {', '.join(good)}" if good else "no variant clearly meets the SLOs"))
        for o in rows:
            ev = "; ".join(
                f"{c['metric'].removesuffix('_ms')} p{c['q']:g} {c['estimate_ms'] or 0:,.0f} ms "
                f"[{(c['ci95_ms'] or [0, 0])[0]:,.0f}, {(c['ci95_ms'] or [0, 0])[1]:,.0f}] vs {c['limit_ms']:,.0f} "
                f"({c['status']})" for c in o["checks"])
            lines.append(f"  {o['variant']}: {o['status']} (n={o['n']}, errors={o['errors']}): {ev}")
    return lines
