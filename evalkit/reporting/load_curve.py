"""The load curve per variant: each level's over-saturation signals (`execution.stops`), the
first saturated level and which signal fired, the knee (the highest load below it that kept the
SLOs), and for a frontier search (`--search`) the answer derived again from the ledger's
levels: the highest load that passed every time, its interval, and the ratio between variants."""

from __future__ import annotations

import json
from typing import Any

from ..execution.frontier import Frontier, Probe, frontier, ratio_line
from ..execution.patterns import BURST, REFERENCE, probe_load
from ..execution.probing import level_need, plan_of, probe_problems, reference_is_probe, stopped_by
from ..execution.stops import LevelOutcome, Point, Slo, rates, saturation_signals, throughput
from ..spec.matrix import arg_value


def level_signals(counts: dict[str, Any], points: list[tuple[Any, ...]], preemptions: float | None,
                  kv_ceiling: float = 0.9) -> dict[str, Any]:
    """One level's over-saturation as the stop rule saw it: its signals, offered and achieved rates,
    from what `stops.LevelOutcome` would hold after its rows (`Ledger.level_series`: its counts, and
    the points `stops.thinned` keeps)."""
    o = LevelOutcome(keep_latencies=False, keep_cases=False, kv_peak=counts["kv_peak"],
                     preemptions_summed=counts["preemptions_summed"], series=[Point(*p) for p in points])
    o.preemptions = preemptions
    offered, achieved = rates(o)
    return {"oversaturated": saturation_signals(o, kv_ceiling), "offered_rps": offered, "achieved_rps": achieved,
            "throughput_rps": throughput(o)}


def load_of(lv: dict[str, Any]) -> tuple[str, float]:
    """(axis, load) of a level: a probe's rate or concurrency, else its concurrency."""
    return probe_load(lv["level"]) or ("concurrency", float(lv["concurrency"]))


def mark_curve(levels: list[dict[str, Any]]) -> None:
    """Per variant, in load order: `first_saturated` on the lowest level that over-saturated, `knee`
    on the last level before the first one that over-saturated or missed the SLOs (none when the
    curve never bent)."""
    for v in dict.fromkeys(lv["variant"] for lv in levels):
        mine = sorted((lv for lv in levels if lv["variant"] == v and lv["level"] not in ("warm-up", BURST)),
                      key=lambda lv: (load_of(lv)[1], lv["level"]))
        if len(mine) < 2:
            continue
        sat = next((lv for lv in mine if lv["oversaturated"]), None)
        if sat is not None:
            sat["first_saturated"] = True
        knee = None
        for lv in mine:  # the knee: the last level before the first that over-saturated or missed the SLOs
            if lv["oversaturated"] or lv["meets_slo"] is False:
                if knee is not None:
                    knee["knee"] = True
                break
            knee = lv


def is_probe(level: str, axis: str, slo: Slo) -> bool:
    """Whether a search's level is one of its probes (not its reference, unless that is its c=1
    probe, nor its throughput burst)."""
    parsed = probe_load(level)
    if parsed is None or parsed[0] != axis:
        return False
    return level != REFERENCE or reference_is_probe(axis, slo) or not slo.relative


def search_frontiers(levels: list[dict[str, Any]], load: dict[str, Any]) -> dict[str, Frontier]:
    """A search run's answer per variant, from its levels, by the probes' own rule: what each held,
    too few requests for the verdict or too short a rate probe is no pass; a bracket that did not
    close was ended by the probe budget when every level was used, else by the time bound."""
    if load.get("kind") != "search":
        return {}
    axis, slo, plan = load.get("search") or "rate", Slo.from_record(load), plan_of(load)
    out = {}
    for v in dict.fromkeys(lv["variant"] for lv in levels):
        probes = []
        mine = [lv for lv in levels if lv["variant"] == v and lv["level"] != "warm-up"]
        for lv in mine:
            if not is_probe(lv["level"], axis, slo):
                continue
            fired = [f"[{k}] {t}" for k, t in lv["oversaturated"].items()]
            fired += [] if lv["slo_p99_ok"] is not False else ["SLO missed"]
            small = probe_problems(lv["n"] - lv["errors"], lv["wall_s"], axis == "rate",
                                   level_need(lv["level"], axis, slo))
            probes.append(Probe(load_of(lv)[1], not (fired or small), "; ".join(fired + small) or None,
                                lv["achieved_rps"], tuple(lv["oversaturated"]), lv["level"], n=lv["n"],
                                duration_s=lv["wall_s"], in_flight=lv.get("in_flight_peak"),
                                in_flight_mean=lv.get("in_flight_mean"), throughput=lv.get("throughput_rps"),
                                inconclusive=bool(small and not fired)))
        out[v] = frontier(axis, probes, float(load.get("tolerance") or 0.1), stopped_by(len(mine), plan))
    return out


def slo_text(load: dict[str, Any]) -> str:
    return Slo.from_record(load).text()


def kv_dtype_of(variant: dict[str, Any]) -> str:
    """The KV-cache dtype a variant was served with ('auto': its served dtype's)."""
    args = json.loads(variant.get("server_args_json") or "[]")
    return str(arg_value(args, "--kv-cache-dtype") or "auto")


def dtype_lines(variants: list[dict[str, Any]], levels: list[dict[str, Any]], load: dict[str, Any],
                held: dict[str, int | None]) -> list[str]:
    """When a variant sets its KV-cache dtype: blocks, requests that fit at once and max load, per dtype."""
    if all(kv_dtype_of(v) == "auto" for v in variants):
        return []
    fr = search_frontiers(levels, load)
    parts = []
    for v in variants:
        f = fr.get(v["name"])
        top = f.unit(f.best) if f else (f"concurrency {held[v['name']]}" if held.get(v["name"]) else "-")
        parts.append(f"{v['name']} (KV {kv_dtype_of(v)}): {v.get('kv_blocks') or '-'} blocks, "
                     f"{v.get('max_concurrency_predicted') or '-'} streams fit, max load {top}")
    return ["capacity by KV-cache dtype: " + "; ".join(parts)]


def curve_lines(levels: list[dict[str, Any]], load: dict[str, Any], baseline: str | None) -> list[str]:
    """The knee and first saturated level per variant; a search's frontier and ratios."""
    out = []
    for v in dict.fromkeys(lv["variant"] for lv in levels):
        knee = next((lv for lv in levels if lv["variant"] == v and lv.get("knee")), None)
        sat = next((lv for lv in levels if lv["variant"] == v and lv.get("first_saturated")), None)
        if knee is None and sat is None:
            continue
        parts = []
        if knee is not None:
            tps = f", {knee['output_tps']:,.0f} output tok/s" if knee.get("output_tps") else ""
            rps = knee.get("achieved_rps") or knee.get("requests_per_s") or 0.0
            parts.append(f"knee at {knee['level']} ({rps:.3g} req/s finished{tps})")
        if sat is not None:
            parts.append(f"first saturated at {sat['level']}: "
                         + "; ".join(f"[{k}] {t}" for k, t in sat["oversaturated"].items()))
        out.append(f"load curve {v}: " + "; ".join(parts))
    fr = search_frontiers(levels, load)
    slo = slo_text(load)
    out += [f.line(v, slo) for v, f in fr.items()]
    if baseline in fr:
        out += [line for v, f in fr.items() if v != baseline and (line := ratio_line(v, baseline or "", f, fr[baseline]))]
    return out


def curve_plots(levels: list[dict[str, Any]], variants: list[str], cols: dict[str, str]) -> list[tuple[str, str]]:
    """The load curve: requests/s finished against the load each level offered (a rate, or requests
    in flight), every variant on one chart; dotted: each variant's knee and first saturated level."""
    from . import svgplot

    axes = {load_of(lv)[0] for lv in levels if lv["level"] not in (REFERENCE, BURST)}
    if len(axes) != 1 or len({load_of(lv)[1] for lv in levels}) <= 1:
        return []
    axis = axes.pop()
    mine = [lv for lv in levels if (lv["level"] != REFERENCE or axis == "concurrency") and lv["level"] != BURST]
    series = {v: sorted((load_of(lv)[1], lv.get("achieved_rps") or lv.get("requests_per_s") or 0.0)
                        for lv in mine if lv["variant"] == v) for v in variants}
    marks = [(load_of(lv)[1], f"{lv['variant']} {'knee' if lv.get('knee') else 'saturated'}", lv["variant"])
             for lv in mine if lv.get("knee") or lv.get("first_saturated")]
    xlabel = "offered rate (requests/s)" if axis == "rate" else "requests in flight"
    title = "Load curve: finished vs offered load (dotted: knee, first saturated level)"
    return [(title, svgplot.lines(title, xlabel, "finished requests/s", series, colors=cols, vlines=marks))]
