"""Capacity: what each variant's KV cache holds and where it stops keeping its SLOs, per load
level; the study's claim in its own shape ("in the same 320 MiB, W8A8 has 2.6x the KV blocks and
keeps the SLO up to concurrency 8 vs 4"); and cost per token at each level."""

from __future__ import annotations

import json
from typing import Any

from ..engines.memory import requests_that_fit
from ..execution.patterns import BURST, REFERENCE
from ..execution.stops import SLO_METRICS, thinned
from ..ledger import Ledger
from ..spec.sizes import human
from ..stats import wilson
from .load_curve import curve_lines, dtype_lines, kv_dtype_of, level_signals, mark_curve
from .plots import QUALITY_GRADERS


def _slo_of(load: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    absolute = {k: load[f"slo_{k}_ms"] for k in SLO_METRICS if load.get(f"slo_{k}_ms") is not None}
    return absolute, dict(load.get("slo_relative") or {})


def load_levels(ledger: Ledger, run_id: str, load: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per variant and load level (a sweep's levels, or the one level), in SQL (`Ledger.level_table`):
    throughput over the level's wall time; KV peak, most running and waiting, preemptions (the
    server's counter); requests in flight; goodput (the share meeting every per-request limit, an
    absolute one or a factor over the same case's latency at concurrency 1, with a Wilson 95 %
    interval); whether the level met the run's SLOs (p99 of each at or under its limit, the sweep's
    own rule); and its over-saturation signals (`load_curve.level_signals`). Sorted and marked
    (`finish_levels`). Second: each level's quality score, for `plots.quality_points`."""
    absolute, relative = _slo_of(load)
    spans = ledger.level_outline(run_id)["spans"]
    starts = {k: {rep: lo for rep, (lo, _) in sp.items()} for k, sp in spans.items()}
    slo = bool(absolute or relative)
    out, scores = [], []
    counts, points = ledger.level_series(run_id, thinned)  # over-saturation's: the points the stop rule keeps
    for t in ledger.level_table(run_id, absolute, relative, QUALITY_GRADERS, REFERENCE):
        v, level, n = t["variant"], t["label"], t["n"]
        sp = spans.get((v, level), {})
        wall_s = _wall_s(sp)
        # the next level on each server began when its first request went: the counter stops there
        until: dict[Any, float] = {}
        for (v2, ph2), st in starts.items():
            if v2 == v and ph2 != level:
                for rep, at in st.items():
                    if at > starts.get((v, level), {}).get(rep, float("inf")):
                        until[rep] = min(until.get(rep, float("inf")), at)
        p99 = {k: t[f"p99_{k}"] for k in absolute}
        p99_rel = {k: t[f"slow_p99_{k}"] for k in relative}
        ok = n - t["errors"]
        preempted = ledger.level_counter_delta(run_id, v, sp, "num_preemptions_total", until)
        wall_ms = max((hi - lo for lo, hi in sp.values()), default=0.0)
        out.append({
            "variant": v, "level": level, "concurrency": t["concurrency"], "n": n,
            "in_flight_peak": t["in_flight_peak"], "in_flight_mean": t["busy_ms"] / wall_ms if wall_ms > 0 else None,
            "errors": t["errors"], "wall_s": wall_s, "prompt_tokens": t["prompt_tokens"], "output_tokens": t["output_tokens"],
            "output_tps": t["output_tokens"] / wall_s if wall_s else None, "requests_per_s": ok / wall_s if wall_s else None,
            "kv_peak": t["kv_peak"], "running_peak": t["running_peak"], "waiting_peak": t["waiting_peak"],
            "preemptions": preempted,
            "slowdown_p99": p99_rel or None,
            "meets_slo": (not t["errors"] and all(p99[k] is not None and p99[k] <= absolute[k] for k in absolute)
                          and all(p99_rel[k] is not None and p99_rel[k] <= relative[k] for k in relative))
            if slo else None,
            "goodput_pct": 100.0 * t["good"] / n if slo and n else None,
            "goodput_ci95_pct": [100 * x for x in ci] if slo and (ci := wilson(t["good"], n)) else None,
            # the search's rule: p99 within each limit (errors are the error-rate rule's)
            "slo_p99_ok": (all(p99[k] is None or p99[k] <= absolute[k] for k in absolute)
                           and all(p99_rel[k] is None or p99_rel[k] <= relative[k] for k in relative)) if slo else None,
            **level_signals(counts[(v, level)], points.get((v, level), []), preempted, load.get("stop_kv") or 0.9),
        })
        if t["quality_n"]:
            scores.append({"variant": v, "level": level, "concurrency": t["concurrency"],
                           "quality_pct": 100.0 * t["quality_pass"] / t["quality_n"], "tps_per_user": t["tps_per_user"]})
    return finish_levels(out), scores


def finish_levels(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Levels in (variant, concurrency, label) order, each variant's curve marked (`mark_curve`)."""
    out.sort(key=lambda x: (x["variant"], x["concurrency"], x["level"]))
    mark_curve(out)
    return out


def _wall_s(spans: dict[Any, tuple[float, float]]) -> float | None:
    """A level's wall time: the longest span of one server's requests (`Ledger.level_outline`'s spans). Each server's rows
    are on the clock of the process that sent them (a Ray worker has its own), so spans are never mixed."""
    return max(hi - lo for lo, hi in spans.values()) / 1000.0 if spans else None


def slo_held_up_to(levels: list[dict[str, Any]], variant: str) -> int | None:
    """The highest concurrency at which this variant met its SLOs, every lower level too, as its
    requests were actually in flight (a level of 16 requests at concurrency 64 held 16): closed-loop
    levels only (an open loop's rows say concurrency 1; a search's burst is not a probe)."""
    best = None
    closed = (x for x in levels if x["variant"] == variant and x.get("offered_rps") is None and x["level"] != BURST)
    for lv in sorted(closed, key=lambda x: x["concurrency"]):
        if lv["meets_slo"] is not True:
            break
        held = lv.get("in_flight_peak")
        best = min(lv["concurrency"], held) if held else lv["concurrency"]
    return best


class Usage:
    """What `capacity` reads of a variant over every level (`Ledger.level_usage`): prompt tokens per
    complexity (sum, count) of the requests that sent any, the concurrencies that saturated the
    cache or preempted, and the highest tested."""

    def __init__(self, prompt: dict[str, list[int]] | None = None, saturated: set[Any] | None = None,
                 tested: int | None = None) -> None:
        self.prompt = prompt or {}
        self.saturated = saturated or set()
        self.tested = tested

    def prompt_mean(self, complexity: str) -> float | None:
        total, n = self.prompt.get(complexity, (0, 0))
        return total / n if n else None


def usage_of(ledger: Ledger, run_id: str, stop_kv: float) -> dict[str, Usage]:
    return {v: Usage(**u) for v, u in ledger.level_usage(run_id, stop_kv).items()}


def capacity(variants: list[dict[str, Any]], levels: list[dict[str, Any]], max_tokens: int,
             usage: dict[str, Usage]) -> list[dict[str, Any]]:
    """Per variant: the KV cache its budget bought (blocks as the engine made them), the requests
    that fit at once at the run's lengths (predicted), where its sweep saturated and why, and the
    highest concurrency at which it kept the SLOs (measured). ``usage``: each variant's `Usage`."""
    out = []
    for v in variants:
        cfg = json.loads(v.get("cache_config_json") or "{}")
        blocks = v.get("kv_blocks") or (int(cfg["num_gpu_blocks"]) if cfg.get("num_gpu_blocks") else None)
        bs = v.get("kv_block_size") or (int(cfg["block_size"]) if cfg.get("block_size") else None)
        if not blocks or not bs:
            out.append({"variant": v["name"], "kv_tokens": None, "note": "the engine did not report cache_config_info"})
            continue
        per = {}
        use = usage.get(v["name"]) or Usage()
        for cx in ("short", "medium", "long"):
            if p := use.prompt_mean(cx):
                per[cx] = requests_that_fit(blocks, bs, p + max_tokens)
        sat = use.saturated
        out.append({"variant": v["name"], "kv_tokens": blocks * bs, "block_size": bs, "blocks": blocks,
                    "kv_cache_dtype": kv_dtype_of(v),
                    "memory_budget_bytes": v.get("memory_budget_bytes"), "weight_bytes": v.get("weight_bytes"),
                    "weight_bytes_reported": v.get("weight_bytes_reported"), "kv_bytes": v.get("kv_bytes"),
                    "engine_max_concurrency": cfg.get("kv_cache_max_concurrency"),
                    "max_concurrency_predicted": v.get("max_concurrency_predicted"),
                    "max_concurrent_by_complexity": per,
                    "saturated_at": v.get("saturated_at"), "saturation_reason": v.get("saturation_reason"),
                    "measured_saturation_concurrency": v.get("saturated_at") or (min(sat) if sat else None),
                    "slo_held_up_to": slo_held_up_to(levels, v["name"]),
                    "max_concurrency_tested": max((lv["in_flight_peak"] for lv in levels if lv["variant"] == v["name"]
                                                   and lv.get("in_flight_peak")), default=use.tested)})
    return out


def capacity_statement(variants: list[dict[str, Any]], levels: list[dict[str, Any]], baseline: str | None,
                       load: dict[str, Any]) -> list[str]:
    """The study's claim in its own shape, one line per candidate that shares the baseline's budget."""
    held = {v["name"]: slo_held_up_to(levels, v["name"]) for v in variants}
    return (_kv_statement(variants, levels, baseline, load) + curve_lines(levels, load, baseline)
            + dtype_lines(variants, levels, load, held))


def _kv_statement(variants: list[dict[str, Any]], levels: list[dict[str, Any]], baseline: str | None,
                  load: dict[str, Any]) -> list[str]:
    by = {v["name"]: v for v in variants}
    base = by.get(baseline or "")
    if not base or not base.get("kv_blocks"):
        return []
    absolute, relative = _slo_of(load)
    slo = ", ".join([f"{k} ≤ {v:g} ms" for k, v in absolute.items()] + [f"{k} ≤ {f:g}x its concurrency-1 value"
                                                                       for k, f in relative.items()])
    out = []
    for name, v in by.items():
        if name == baseline or not v.get("kv_blocks"):
            continue
        same = v.get("memory_budget_bytes") and v.get("memory_budget_bytes") == base.get("memory_budget_bytes")
        swept = len({lv["concurrency"] for lv in levels if lv["variant"] == name}) > 1
        if not same and not swept and not (v.get("saturated_at") or base.get("saturated_at")):
            continue  # a sequential run without a shared budget says nothing about capacity
        where = f"in the same {human(v['memory_budget_bytes'])}" if same else "with its own memory (no shared budget)"
        ratio = v["kv_blocks"] / base["kv_blocks"]
        line = f"{where}, {name} has {ratio:.2f}x the KV blocks of {baseline} ({v['kv_blocks']} vs {base['kv_blocks']})"
        if slo and load.get("kind") != "search":  # a search's probes are rates: its frontier lines say it
            c2, c1 = slo_held_up_to(levels, name), slo_held_up_to(levels, baseline)
            line += (f" and keeps the SLO ({slo}) up to concurrency {c2 if c2 is not None else 'none'} vs "
                     f"{c1 if c1 is not None else 'none'} for {baseline}")
        s2, s1 = v.get("saturated_at"), base.get("saturated_at")
        if s2 or s1:
            line += (f"; saturated at concurrency {s2 or 'not reached'} ({v.get('saturation_reason') or '-'}) vs "
                     f"{s1 or 'not reached'} ({base.get('saturation_reason') or '-'})")
        out.append(line)
    return out


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
        entry = {**{k: lv[k] for k in ("variant", "level", "concurrency", "meets_slo", "output_tps", "requests_per_s")},
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
