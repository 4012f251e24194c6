"""`evalkit plan`: how many cases a question needs, and how long that takes here. From a pilot run
(the latest run, or `--from LEDGER [--run ID]`) it takes each metric's per-case spread of the
paired difference, and from every complete run of the same matrix the between-run spread (the
machine's own drift, other tenants): a difference below what that spread allows cannot be shown by
one run however large. Time per case comes from the pilot's own request times."""

from __future__ import annotations

import math
from typing import Any

from ..errors import EvalkitError, UsageError
from ..execution.sizing import PRIORS, cases_needed, mde, mmss, paired_diffs, spread
from ..grading import paired_differences
from ..grading.registry import available, use_run
from ..grading.registry import margins as registry_margins
from ..host import host_line, this_host
from ..ledger import Ledger
from .verdicts import hypotheses, pairs_needed, parse_margins

METRICS = {"drift": "", "e2e_mean": " %"}


def metrics() -> dict[str, str]:
    """metric -> unit: drift and E2E, then every registered grader's margin (a plugin's too)."""
    out = dict(METRICS)
    for name, (_, m) in registry_margins().items():
        out.setdefault(name, " pp" if m.unit == "pp" else "")
    return out


def grader_diffs(ledger: Ledger, run_id: str) -> dict[str, tuple[float, int]]:
    """margin -> (SD of the per-case candidate-minus-baseline differences, pairs) for every grader
    margin but drift's (sizing.paired_diffs has it), pooled over candidates: a plugin's margin
    plans like a built-in's. Pass rates in percentage points."""
    base = ledger.baseline(run_id)
    rows = [r for r in ledger.measured_requests(run_id, ok_only=True) if (r["concurrency"] or 1) == 1]
    grades = ledger.latest_grades(run_id)
    reg = available()
    out: dict[str, list[float]] = {}
    for name, (grader, m) in registry_margins().items():
        if name in METRICS or grader not in reg:
            continue
        for v in sorted({r["variant"] for r in rows} - {base}):
            def side(var: str, grader: str = grader) -> list[dict[str, Any]]:
                return [{**grades[r["id"]][grader], "case_id": r["case_id"], "repeat": r["repeat"]} for r in rows
                        if r["variant"] == var and grader in grades.get(r["id"], {})]

            xs = paired_differences(reg[grader], side(v), side(base or "")).get(name, [])
            if len(xs) >= 2:
                scale = 100.0 if m.unit == "pp" else 1.0
                mu = sum(xs) / len(xs)
                out.setdefault(name, []).append(scale * math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)))
                out.setdefault(f"{name}#n", []).append(len(xs))
    return {k: (sum(sds) / len(sds), int(sum(out[f"{k}#n"]))) for k, sds in out.items() if not k.endswith("#n")}


def parse_detect(text: str) -> dict[str, float]:
    known = metrics()
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        k, eq, v = part.partition("=")
        k = k.strip()
        if not eq or k not in known:
            raise UsageError(f"--detect: '{part}': expected METRIC=DIFFERENCE with METRIC in {', '.join(known)}")
        try:
            out[k] = abs(float(v.strip().rstrip("%")))
        except ValueError:
            raise UsageError(f"--detect: '{v}' is not a number") from None
        if out[k] == 0:
            raise UsageError(f"--detect: '{part}': a difference to detect must be above 0")
    return out


def between_run_sd(ledger: Ledger, matrix_name: str) -> tuple[dict[str, float], int]:
    """The SD of one candidate's per-run mean difference across complete runs of one matrix, less
    what each run's own sampling explains (0 when the runs agree within it), pooled over the
    candidates that ran at least twice; and how many complete runs there are. Two candidates of one
    run are two questions, not two runs: their spread is never taken for the machine's drift."""
    means: dict[tuple[str, str], list[tuple[float, float]]] = {}
    runs = [r for r in ledger.run_ids(matrix_name) if ledger.require_run(r)["status"] == "complete"]
    for rid in runs:
        for variant, d in paired_diffs(ledger, rid).items():
            for metric, xs in d.items():
                if len(xs) >= 2:
                    m = sum(xs) / len(xs)
                    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
                    means.setdefault((variant, metric), []).append((m, var / len(xs)))
    pooled: dict[str, list[float]] = {}
    for (_, metric), ms in means.items():
        if len(ms) >= 2:
            mu = sum(m for m, _ in ms) / len(ms)
            between = sum((m - mu) ** 2 for m, _ in ms) / (len(ms) - 1)
            pooled.setdefault(metric, []).append(max(0.0, between - sum(v for _, v in ms) / len(ms)))
    return {metric: math.sqrt(sum(v) / len(v)) for metric, v in pooled.items()}, len(runs)


def seconds_per_case(ledger: Ledger, run_id: str) -> tuple[float, float]:
    """(seconds of measured requests per case across every variant, fixed seconds of server
    starts) from a run's own rows (sequential: E2E adds up)."""
    run = ledger.require_run(run_id)
    e2e_ms, cases = ledger.measured_e2e(run_id)  # a sum in SQL: the rows stay in the ledger
    per_case = e2e_ms / 1000.0 / max(1, run["n_cases"] or cases)
    starts = sum(v.get("ready_s") or 0.0 for v in ledger.variants(run_id))
    return per_case, starts


def default_detect(margins: dict[str, Any] | None) -> dict[str, float]:
    """What a bare `evalkit plan` asks: to detect a difference the size of each margin of the
    pilot's matrix (one plan can size: drift, E2E in %, a grader's), else of the embedded default
    matrix's (drift 0.1, e2e_mean 5 %)."""
    from ..spec.matrix import load_matrix

    known = metrics()
    for source in (margins, load_matrix(None).margins):
        out = {ms.metric: abs(ms.value) for ms in parse_margins(source, "matrix margins")
               if ms.metric in known and ms.value and (ms.unit != "ms")}
        if out:
            return out
    return {}


def plan(ledger: Ledger, run_id: str | None, detect: dict[str, float], cases: int | None = None) -> dict[str, Any]:
    run = ledger.require_run(run_id)
    rid = run["id"]
    use_run(run)  # the margins of its workload's graders parse like a built-in's
    asked = None
    if not detect and not cases:  # bare: the question the matrix's margins already ask
        detect, asked = default_detect(run.margins), ""
    spreads = {**grader_diffs(ledger, rid), **spread(paired_diffs(ledger, rid))}
    between, n_runs = between_run_sd(ledger, run["matrix_name"])
    per_case, fixed = seconds_per_case(ledger, rid)
    out: dict[str, Any] = {"pilot_run": rid, "matrix": run["matrix_name"], "runs_of_matrix": n_runs,
                           "pilot_host": host_line(ledger.host(run.get("host_id"))), "this_host": host_line(this_host()),
                           "seconds_per_case": per_case, "fixed_seconds": fixed, "metrics": [], "asked": asked}
    specs = parse_margins(run.margins, "matrix margins")
    hyp = hypotheses(specs)
    # the fewest pairs at which every margin can be decided (no margins: one two-sided test, 6)
    floor = pairs_needed(specs, max(hyp, 1))
    per_pair = pilot_cases_per_pair(run)  # a loaded level's pairs are its alternation chunks
    out.update({"floor": floor, "margins": [ms.text for ms in specs], "hypotheses": hyp, "cases_per_pair": per_pair,
                "floor_cases": floor * per_pair})
    if asked is not None:  # a bare plan sizes the margins it has something to size from
        detect = {k: v for k, v in detect.items() if k in spreads or k in PRIORS}
        out["asked"] = ", ".join(f"{k}={v:g}{metrics().get(k, '').strip()}" for k, v in sorted(detect.items()))
    for metric in sorted(set(detect) | (set(METRICS) if cases else set())):
        if metric not in spreads and metric not in PRIORS:
            raise UsageError(f"--detect {metric}: the pilot run {rid} has no paired grades of it to plan from")
        sd, n = spreads.get(metric, (PRIORS.get(metric), 0))
        tau = between.get(metric, 0.0)
        e: dict[str, Any] = {"metric": metric, "sd": sd, "pilot_pairs": n, "between_run_sd": tau,
                             "source": f"pilot run {rid} ({n} pairs)" if n else "shipped prior (the pilot has none)"}
        if metric in detect:
            need = cases_needed(sd, detect[metric], tau)
            if need is not None and need < floor * per_pair:  # fewer could never reach a verdict on the margins
                need = e["floor"] = floor * per_pair
            e.update({"detect": detect[metric], "cases": need,
                      "seconds": fixed + need * per_case if need else None})
        if cases:
            e["cases_given"] = cases
            e["mde"] = math.sqrt(mde(sd, cases) ** 2 + (2.8016 * tau) ** 2)
        out["metrics"].append(e)
    out["suites"] = suite_plan(ledger, rid, cases)
    return out


def suite_plan(ledger: Ledger, run_id: str, cases: int | None) -> list[dict[str, Any]]:
    """Per candidate and suite of the pilot: the accuracy drop its items can detect with McNemar's
    test (80 % power, 5 % two-sided; `stats.accuracy.min_detectable_difference`, Connor 1987),
    from the pilot's baseline accuracy and discordance (the share of items the two disagree on),
    at the pilot's number of items or at ``cases``."""
    from ..stats.accuracy import min_detectable_difference
    from .suites import suite_accuracy

    run = ledger.require_run(run_id)
    base = ledger.baseline(run_id)
    entries = suite_accuracy(ledger, run_id, base, run.repeats)
    acc = {e["suite"]: e["accuracy_pct"] for e in entries if e["variant"] == base}
    out = []
    for e in entries:
        if not e.get("pairs") or not acc.get(e["suite"]):
            continue
        psi = (e["lost"] + e["gained"]) / e["pairs"] or 1.0 / e["pairs"]  # none seen: as if one
        n = cases or e["pairs"]
        mdd = min_detectable_difference(n, acc[e["suite"]] / 100.0, psi)
        out.append({"variant": e["variant"], "suite": e["suite"], "items": n, "discordance": psi,
                    "base_accuracy_pct": acc[e["suite"]], "mdd_pp": mdd})
    return out


def plan_lines(p: dict[str, Any]) -> list[str]:
    lines = [f"pilot: run {p['pilot_run']} of matrix {p['matrix']} ({p['runs_of_matrix']} complete run(s) of it in "
             f"the ledger); {mmss(p['seconds_per_case'])} of requests per case across its variants"]
    lines.append(floor_line(p))
    if p.get("asked"):
        lines.append(f"asked: --detect {p['asked']}, the size of the matrix's margins (give --detect or --cases to "
                     "ask another question)")
    if p["pilot_host"] != p["this_host"]:
        lines.append(f"note: the pilot ran on another machine ({p['pilot_host']}); its times may not hold here")
    for e in p["metrics"]:
        unit = metrics().get(e["metric"], "")
        tau = f", between-run SD {e['between_run_sd']:.3g}{unit}" if e["between_run_sd"] else ""
        if "detect" in e:
            if e["cases"] is None:
                lines.append(f"{e['metric']}: a difference of {e['detect']:g}{unit} is below what one run can show "
                             f"here (between-run spread alone: {2.8016 * e['between_run_sd']:.3g}{unit}); pool runs "
                             "with `evalkit compare`")
            else:
                lines.append(f"{e['metric']}: to detect {e['detect']:g}{unit} at 80 % power (5 % two-sided): "
                             f"{e['cases']} cases, about {mmss(e['seconds'])} here (per-case SD {e['sd']:.3g}{unit} "
                             f"from {e['source']}{tau})"
                             + (f"; raised to {e['floor']}, the fewest cases at which every margin of the matrix "
                                "can be decided (above)" if e.get("floor") else ""))
        if "mde" in e:
            lines.append(f"{e['metric']}: {e['cases_given']} cases can detect {e['mde']:.3g}{unit} (80 % power; SD "
                         f"{e['sd']:.3g}{unit} from {e['source']}{tau})")
    for s in p.get("suites") or []:
        what = "no drop at that discordance" if s["mdd_pp"] is None else f"a drop of {s['mdd_pp']:.3g} pp"
        lines.append(f"accuracy {s['suite']} ({s['variant']}): {s['items']} items can detect {what} (McNemar, 80 % "
                     f"power; the pilot's baseline accuracy {s['base_accuracy_pct']:.0f} %, discordance "
                     f"{s['discordance']:.2f})")
    return lines



def floor_line(p: dict[str, Any]) -> str:
    """What the smallest run that can answer the matrix's margins is, and why."""
    if not p["margins"]:
        return (f"no margins in the matrix: at least {p['floor']} pairs for one two-sided test to reach p < 0.05 "
                "(an exact sign-flip test of n pairs cannot go below 2 / 2ⁿ)")
    return (f"margins {', '.join(p['margins'])}: at least {p['floor']} pairs before every one can be decided: the "
            f"fewest at which a candidate with no difference could be shown non-inferior on each (exact tests at "
            f"Holm's first step over {p['hypotheses']} hypotheses; a KL margin's own floor; docs/verdicts.md). "
            "This is reachability, not power: --detect sizes for 80 % power"
            + (f". The pilot's first level alternated its variants in blocks of at least {p['cases_per_pair']} "
               f"cases, and a block is one pair: at least {p['floor_cases']} cases" if p.get("cases_per_pair", 1) > 1
               else ""))


def pilot_cases_per_pair(run: Any) -> int:
    """The cases that make one pair on the pilot's first level (`Load.cases_per_pair`)."""
    from ..execution.load import Load

    try:
        return Load.from_record(run.load or {}).cases_per_pair()
    except (EvalkitError, KeyError, ValueError):  # a load this evalkit cannot read back: pairs taken as cases
        return 1
