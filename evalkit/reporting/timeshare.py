"""What the report says about time (issue 47): how the variants shared it (`execution/order.py`),
whether the machine moved under a verdict, the A/A control, the position effect and the load
each variant ran under. Every latency verdict reads `machine` from here: a variant whose sides
ran under measurably different load is *undecided*, with the cause in its line.

- **A/A control**: the baseline's noise-floor pass against its own first pass, paired as the
  verdicts pair (by case, or by block: `pairing`), per latency metric: "A/A e2e_mean +0.4 %
  [−2.1, +2.9]". Alternated with the rest, it is the difference the machine alone makes between
  two sends of the same thing; a margin inside it is said to be so.
- **Position effect**: how much slower (or faster) a request is when sent later in its group of
  the alternation than first, on the log scale, per case (each variant is first equally often,
  so the variants' own difference cancels).
"""

from __future__ import annotations

import math
from typing import Any

from ..grading.margins import LATENCY, MarginSpec
from ..ledger import Ledger
from ..stats import robust_mean, robust_ratio
from .machine import BaseSeries, SideLoad, block_moved, machine_moved
from .pairing import by_blocks

AA_DEFAULT = ("e2e_mean", "tpot_mean")  # the A/A metrics when no latency margin is given
LEVEL = 0.95


def timeshare(ledger: Ledger, run_id: str, baseline: str | None, specs: list[MarginSpec]) -> dict[str, Any]:
    """The run's order, each candidate's machine cause (or None), the A/A control per latency
    metric, the position effect and the load summary per variant, and the lines that say them."""
    run = ledger.require_run(run_id)
    load = run.load
    order = {"kind": order_kind(load), "why": load.get("order_why") or ""}
    variants = [v["name"] for v in ledger.variants(run_id)]
    env = ledger.env_load(run_id)
    out: dict[str, Any] = {"order": order, "machine": {}, "notes": {}, "aa": [], "position_effect": None,
                           "env_load": [env[v] for v in variants if v in env]}
    if baseline is None:
        return {**out, "lines": [], "headline": []}
    out.update(machine_time(ledger, run_id, baseline))
    metrics = [s.metric for s in specs if s.metric in LATENCY] or list(AA_DEFAULT)
    out["aa"] = [a for m in dict.fromkeys(metrics) if (a := aa_control(ledger, run_id, baseline, run.repeats, m,
                                                                         specs))]
    if order["kind"] in ("alternate", "blocks"):
        out["position_effect"] = position_effect(ledger, run_id)
    every = lines(out, baseline, specs)
    # beside the verdict (every output's verdict block): the order, the A/A control, what undid a verdict
    out["headline"] = [x for x in every if x.startswith(("order:", "A/A")) or "verdicts undecided" in x]
    out["lines"] = [x for x in every if x not in out["headline"]]
    return out


def order_kind(load: dict[str, Any]) -> str:
    """A run's order from its load record (a run from before orders: interleaved or one after the other)."""
    return load.get("order") or ("alternate" if load.get("interleave") else "sequential")


def machine_time(ledger: Ledger, run_id: str, baseline: str) -> dict[str, Any]:
    """What the verdicts read of time: each candidate's machine cause (or None) and its order's note.
    Variant means and a change point in the baseline's series (`machine_moved`); with one server at
    a time, a step between the two sides of one chunk (`block_moved`), since they ran minutes apart."""
    run = ledger.require_run(run_id)
    kind = order_kind(run.load)
    host = ledger.host(run.get("host_id")) or {}
    cores = ledger.env_cpus(run_id) or host.get("threads") or host.get("cores")  # the CPUs the load was read on
    env = ledger.env_load(run_id)
    series = BaseSeries(foreign_cpu=[v for _, v in ledger.env_series(run_id, baseline)],
                        latency=ledger.series_shift(run_id, "e2e_ms", baseline))
    blocks = ledger.env_by_block(run_id) if kind == "blocks" else []
    out: dict[str, Any] = {"machine": {}, "notes": {}}
    for v in [x["name"] for x in ledger.variants(run_id) if x["name"] != baseline]:
        if baseline in env and v in env:
            out["machine"][v] = machine_moved(SideLoad.from_summary(env[baseline]), SideLoad.from_summary(env[v]),
                                              series, host_cores=cores) or block_moved(blocks, baseline, v,
                                                                                       host_cores=cores)
        out["notes"][v] = side_note(kind, ledger, run_id, baseline, v)
    return out


def side_note(kind: str, ledger: Ledger, run_id: str, baseline: str, variant: str) -> str | None:
    """What a latency verdict must say about when and where its sides ran, or None."""
    if kind == "sequential":
        return "its sides ran at different times (--order sequential): a change of the machine between them reads " \
               "as a difference"
    if kind == "blocks":
        return "one server at a time (--order blocks): a chunk's cases ran together, minutes from the other side's, " \
               "so each chunk is one pair"
    if kind == "parallel":
        nodes = {v["name"]: v.get("node") for v in ledger.variants(run_id)}
        if nodes.get(baseline) and nodes.get(variant) and nodes[baseline] != nodes[variant]:
            return f"compared across machines: {baseline} ran on {nodes[baseline]}, {variant} on {nodes[variant]}"
        return "its sides ran at the same time, side by side (Ray tasks), competing for the machine"
    return None


def aa_control(ledger: Ledger, run_id: str, baseline: str, repeats: int, metric: str,
               specs: list[MarginSpec]) -> dict[str, Any] | None:
    """The baseline against itself on one latency metric: its noise-floor pass(es) against its
    measured repeats, paired as the verdicts pair (by case, or by block where the variants
    alternated in blocks: `pairing`), at 95 %; None when the baseline was sent once."""
    field, _ = LATENCY[metric]
    floor, by_block, cases = ledger.aa_cases(run_id, field, baseline, repeats)
    if not floor:
        return None
    unit = next((s.unit for s in specs if s.metric == metric), "%")
    again, main = [a for _, a, _, _ in cases], [m for _, _, m, _ in cases]
    if by_block:  # a case's block is its first request's (its level is not read here)
        again, main = by_blocks(again, main, [(None, b) for *_, b in cases], "sum" if unit == "%" else "mean")
    if len(main) < 2:
        return {"metric": metric, "unit": unit, "pairs": len(main), "estimate": None, "ci": None}
    t = robust_ratio(again, main) if unit == "%" else robust_mean([x - y for x, y in zip(again, main, strict=True)])
    iv = t.interval(1 - LEVEL)
    margin = next((s for s in specs if s.metric == metric), None)
    inside = bool(margin and iv and min(iv) <= margin.value <= max(iv))
    return {"metric": metric, "unit": unit, "pairs": t.n, "estimate": t.estimate, "ci": list(iv) if iv else None,
            "level": LEVEL, "margin": margin.value if margin else None, "margin_inside": inside,
            "paired_by": "block" if by_block else "case"}


def position_effect(ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    """Later in a group against first, E2E on the log scale per group, as a % with its 95 %
    interval; None without alternated groups (a loaded level's chunk is a group too)."""
    diffs = [later - first for first, later in ledger.position_groups(run_id)]
    if len(diffs) < 2:
        return None
    t = robust_mean(diffs)
    iv = t.interval(1 - LEVEL)
    pct = 100.0 * (math.exp(t.estimate) - 1.0) if t.estimate is not None else None
    return {"metric": "e2e_ms", "groups": t.n, "estimate_pct": pct,
            "ci_pct": [100.0 * (math.exp(x) - 1.0) for x in iv] if iv else None, "level": LEVEL}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3g}"


def lines(ts: dict[str, Any], baseline: str, specs: list[MarginSpec]) -> list[str]:
    out = [f"order: {ts['order']['kind']}" + (f" ({ts['order']['why']})" if ts["order"]["why"] else "")]
    for a in ts["aa"]:
        u = " %" if a["unit"] == "%" else f" {a['unit']}" if a["unit"] in ("ms", "pp") else ""
        if a["estimate"] is None:
            out.append(f"A/A {a['metric']}: {a['pairs']} pairs, too few for an interval")
            continue
        ci = f" [{_pct(a['ci'][0])}, {_pct(a['ci'][1])}]" if a["ci"] else ""
        tail = (f"; the margin {a['margin']:+g}{u} lies inside this noise: the run cannot tell a difference that small "
                "from the machine's own") if a["margin_inside"] else ""
        out.append(f"A/A {a['metric']} {_pct(a['estimate'])}{u}{ci} ({baseline} against itself, {a['pairs']} pairs, "
                   f"{a['level']:.0%}){tail}")
    pe = ts["position_effect"]
    if pe and pe["estimate_pct"] is not None:
        ci = f" [{_pct(pe['ci_pct'][0])}, {_pct(pe['ci_pct'][1])}]" if pe["ci_pct"] else ""
        out.append(f"position effect: sent later in its group, E2E {_pct(pe['estimate_pct'])} %{ci} against first "
                   f"({pe['groups']} groups; balanced, so it cancels between variants)")
    for e in ts["env_load"]:
        if e.get("samples"):
            out.append(f"machine load while {e['variant']} ran: foreign CPU {e['foreign_cpu_mean'] or 0:.2f} cores "
                       f"(p90 {e['foreign_cpu_p90'] or 0:.2f}), steal {100 * (e['steal_mean'] or 0):.1f} %, "
                       f"iowait {100 * (e['iowait_mean'] or 0):.1f} % ({e['samples']} samples)")
    for v, cause in ts["machine"].items():
        if cause:
            out.append(f"{v}: latency verdicts undecided: {cause}")
    for v, note in ts["notes"].items():
        if note:
            out.append(f"{v} vs {baseline}: {note}")
    return out
