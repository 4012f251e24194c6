"""Traffic like production, checked: a trace's fidelity (achieved against recorded inter-arrival
times and token lengths), what a workload shares by design next to what the server's prefix cache
served, and how conversations went (turns answered, turns left)."""

from __future__ import annotations

from typing import Any

from ..catalogue import Metric, fmt
from ..ledger import Ledger
from ..stats import mean, percentile


def trace_fidelity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows if r.get("trace_row") is not None):
        rs = sorted((r for r in rows if r["variant"] == v and r.get("trace_row") is not None),
                    key=lambda r: r["trace_row"])
        timed = [r for r in rs if r["scheduled_ms"] is not None and r["sent_ms"] is not None]
        rec = [b["scheduled_ms"] - a["scheduled_ms"] for a, b in zip(timed, timed[1:], strict=False)]
        got = [b["sent_ms"] - a["sent_ms"] for a, b in zip(timed, timed[1:], strict=False)]
        err = [abs(g - r) for g, r in zip(got, rec, strict=True)]
        span_rec, span_got = sum(rec), sum(got)
        ok = [r for r in rs if r["error_class"] is None]
        inp = [r for r in ok if r.get("trace_input_tokens") and r["prompt_tokens"]]
        outp = [r for r in ok if r.get("trace_output_tokens") and r["completion_tokens"]]
        out.append({
            "variant": v, "rows": len(rs), "errors": len(rs) - len(ok),
            "recorded_span_s": span_rec / 1000.0, "achieved_span_s": span_got / 1000.0,
            "span_error_pct": 100.0 * (span_got - span_rec) / span_rec if span_rec else None,
            "gap_error_mean_ms": mean(err), "gap_error_p99_ms": percentile(err, 99),
            "mean_gap_error_pct": 100.0 * (mean(got) - mean(rec)) / mean(rec) if rec and mean(rec) else None,
            "input_exact_pct": 100.0 * sum(r["prompt_tokens"] == r["trace_input_tokens"] for r in inp) / len(inp)
            if inp else None,
            "input_abs_diff_mean": mean([abs(r["prompt_tokens"] - r["trace_input_tokens"]) for r in inp]),
            "output_exact_pct": 100.0 * sum(r["completion_tokens"] == r["trace_output_tokens"] for r in outp) / len(outp)
            if outp else None,
        })
    return out


def prefix_sharing(ledger: Ledger, run_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: the share of prompt tokens the workload shares by design (a trace's repeated
    hash blocks, a shared system prompt), the share the server reported as served from its prefix
    cache (per request, `cached_tokens`), and its own hit counters over the run."""
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == v and r["error_class"] is None and r["prompt_tokens"]]
        designed = [r for r in rs if r.get("designed_shared_tokens") is not None]
        cached = [r for r in rs if r.get("cached_prompt_tokens") is not None]
        hits = ledger.series_delta(run_id, v, "prefix_cache_hits_total")
        queries = ledger.series_delta(run_id, v, "prefix_cache_queries_total")
        if not designed and not any(r["cached_prompt_tokens"] for r in cached) and not queries:
            continue  # nothing shared by design and nothing served from a cache: nothing to say
        out.append({
            "variant": v,
            "designed_shared_pct": 100.0 * sum(r["designed_shared_tokens"] for r in designed)
            / sum(r["prompt_tokens"] for r in designed) if designed else None,
            "cached_pct": 100.0 * sum(r["cached_prompt_tokens"] for r in cached) / sum(r["prompt_tokens"] for r in cached)
            if cached else None,
            "server_hit_pct": 100.0 * hits / queries if queries else None,
        })
    return out


def conversations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows if r.get("conversation_id")):
        rs = [r for r in rows if r["variant"] == v and r.get("conversation_id")]
        convs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in rs:
            convs.setdefault((r["conversation_id"], r["repeat"]), []).append(r)
        whole = sum(all(r["error_class"] is None for r in c) for c in convs.values())
        out.append({"variant": v, "conversations": len(convs), "turns": len(rs), "completed": whole,
                    "turns_failed": sum(r["error_class"] is not None for r in rs)})
    return out


def traffic_lines(f: dict[str, Any]) -> list[str]:
    lines = []
    for t in f.get("trace_fidelity", []):
        lines.append(f"trace {t['variant']}: {t['rows']} rows, recorded span {t['recorded_span_s']:.2f} s vs achieved "
                     f"{t['achieved_span_s']:.2f} s ({t['span_error_pct'] or 0:+.1f} %); inter-arrival error mean "
                     f"{t['gap_error_mean_ms'] or 0:.1f} ms, p99 {t['gap_error_p99_ms'] or 0:.1f} ms; prompt lengths exact in "
                     f"{t['input_exact_pct'] if t['input_exact_pct'] is None else round(t['input_exact_pct'])} %, outputs "
                     f"in {t['output_exact_pct'] if t['output_exact_pct'] is None else round(t['output_exact_pct'])} %")
    for p in f.get("prefix_sharing", []):
        lines.append(f"prefix cache {p['variant']}: shared by design {_pct(p['designed_shared_pct'])} of prompt tokens; "
                     f"served from the cache {_pct(p['cached_pct'])} (per request); server hit rate "
                     f"{_pct(p['server_hit_pct'])}")
    for c in f.get("conversations", []):
        lines.append(f"conversations {c['variant']}: {c['completed']} of {c['conversations']} completed, "
                     f"{c['turns']} turns, {c['turns_failed']} failed")
    return lines


PCT = Metric("pct", "%", 1)


def _pct(x: float | None) -> str:
    return fmt(PCT, x) + (" %" if x is not None else "")
