"""Traffic like production, checked: a trace's fidelity (achieved against recorded inter-arrival
times and token lengths), what a workload shares by design next to what the server's prefix cache
served, and how conversations went (turns answered, turns left)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from ..catalogue import Metric, fmt
from ..ledger import Ledger
from ..stats import mean, percentile


def trace_fidelity(ledger: Ledger, run_id: str, variants: Iterable[str]) -> list[dict[str, Any]]:
    """`trace_entry` of each of ``variants`` (in that order) with rows of a replayed trace."""
    traced = ledger.level_outline(run_id)["traced"]
    return [trace_entry(v, ledger.trace_rows(run_id, v)) for v in variants if traced.get(v)]


def trace_entry(v: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One variant's trace fidelity from its trace rows in trace order, in one pass (the rows, or
    `Ledger.trace_rows` read as they come)."""
    rec, got = array("d"), array("d")
    prev: tuple[float, float] | None = None
    n = errors = inp_n = inp_exact = outp_n = outp_exact = 0
    inp_diff: list[int] = []
    for r in rows:
        n += 1
        if r["scheduled_ms"] is not None and r["sent_ms"] is not None:
            if prev is not None:
                rec.append(r["scheduled_ms"] - prev[0])
                got.append(r["sent_ms"] - prev[1])
            prev = (r["scheduled_ms"], r["sent_ms"])
        if r["error_class"] is not None:
            errors += 1
            continue
        if r.get("trace_input_tokens") and r["prompt_tokens"]:
            inp_n += 1
            inp_exact += r["prompt_tokens"] == r["trace_input_tokens"]
            inp_diff.append(abs(r["prompt_tokens"] - r["trace_input_tokens"]))
        if r.get("trace_output_tokens") and r["completion_tokens"]:
            outp_n += 1
            outp_exact += r["completion_tokens"] == r["trace_output_tokens"]
    err = [abs(g - x) for g, x in zip(got, rec, strict=True)]
    span_rec, span_got = sum(rec), sum(got)
    return {
        "variant": v, "rows": n, "errors": errors,
        "recorded_span_s": span_rec / 1000.0, "achieved_span_s": span_got / 1000.0,
        "span_error_pct": 100.0 * (span_got - span_rec) / span_rec if span_rec else None,
        "gap_error_mean_ms": mean(err), "gap_error_p99_ms": percentile(err, 99),
        "mean_gap_error_pct": 100.0 * (mean(got) - mean(rec)) / mean(rec) if rec and mean(rec) else None,  # type: ignore[operator]
        "input_exact_pct": 100.0 * inp_exact / inp_n if inp_n else None,
        "input_abs_diff_mean": mean(inp_diff),  # type: ignore[arg-type]
        "output_exact_pct": 100.0 * outp_exact / outp_n if outp_n else None,
    }


def prefix_sharing(ledger: Ledger, run_id: str, sums: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Per variant: the share of prompt tokens the workload shares by design (a trace's repeated
    hash blocks, a shared system prompt), the share the server reported as served from its prefix
    cache (per request, `cached_tokens`), and its own hit counters over the run. ``sums``: the
    first of `Ledger.traffic_sums`."""
    out = []
    for v, (designed, shared, dprompt, cached, cached_any, ctokens, cprompt) in sums.items():
        hits = ledger.series_delta(run_id, v, "prefix_cache_hits_total")
        queries = ledger.series_delta(run_id, v, "prefix_cache_queries_total")
        if not designed and not cached_any and not queries:
            continue  # nothing shared by design and nothing served from a cache: nothing to say
        out.append({
            "variant": v,
            "designed_shared_pct": 100.0 * shared / dprompt if designed else None,
            "cached_pct": 100.0 * ctokens / cprompt if cached else None,
            "server_hit_pct": 100.0 * hits / queries if queries else None,
        })
    return out


def conversations(sums: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Per variant with multi-turn conversations: how many (a conversation per repeat), how many had
    every turn answered, turns, turns failed (the second of `Ledger.traffic_sums`)."""
    return [{"variant": v, "conversations": n, "turns": turns, "completed": done, "turns_failed": failed}
            for v, (n, done, turns, failed) in sums.items()]


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
