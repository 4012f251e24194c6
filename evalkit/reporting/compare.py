"""Many runs, one answer: `evalkit compare RUN RUN ...` pools repeated runs of one matrix. Each
run gives its own estimate per variant and metric (candidate − baseline, paired by case, with
its interval); the pooled estimate is their mean, with a between-run 95 % interval (Student t
over runs), and the between-run SD beside the within-run one, so a team sees how much of the
answer is the machine's own drift. Runs from different hosts, versions or dtypes are warned about."""

from __future__ import annotations

import math
from typing import Any

from scipy.special import stdtrit  # Student's t quantile (what scipy.stats' t.ppf calls)

from ..errors import UsageError
from ..host import hosts_differ
from ..ledger import Ledger
from ..stats import PairedTest, mean
from .verdicts import known_metrics, ledger_tests, parse_margins


def _se(t: PairedTest) -> float | None:
    """The standard error the test's own 95 % interval implies (its half-width / 1.96)."""
    iv = t.interval(0.05) if t.n >= 2 else None
    if not iv or not all(math.isfinite(x) for x in iv):
        return None
    return (iv[1] - iv[0]) / (2 * 1.959964)


def default_metrics() -> list[str]:
    return [m for m in ("e2e_mean", "ttft_mean", "tpot_mean", "drift", "schema_pass", "persona_pass", "formality_mae")
            if m in known_metrics()]


def compare(ledger: Ledger, run_ids: list[str] | None, metrics: list[str] | None = None) -> dict[str, Any]:
    if not run_ids:
        latest = ledger.require_run(None)
        run_ids = [r for r in ledger.run_ids(latest["matrix_name"]) if ledger.require_run(r)["status"] == "complete"]
    runs = [ledger.require_run(r) for r in run_ids]
    if len(runs) < 2:
        raise UsageError(f"compare: give at least two runs of one matrix (found {len(runs)})")
    names = {r["matrix_name"] for r in runs}
    warnings = []
    if len(names) > 1:
        warnings.append(f"warning: these runs are of different matrices ({', '.join(sorted(names))})")
    if w := hosts_differ([ledger.host(r.get("host_id")) for r in runs]):
        warnings.append(w)
    versions = {(r.get("evalkit_version"), (ledger.host(r.get("host_id")) or {}).get("vllm_version")) for r in runs}
    if len(versions) > 1:
        warnings.append(f"warning: evalkit / vLLM versions differ across these runs: {sorted(versions, key=str)}")
    dtypes = {(v["name"], v.get("dtype")) for r in runs for v in ledger.variants(r["id"])}
    by_name: dict[str, set] = {}
    for n, d in dtypes:
        by_name.setdefault(n, set()).add(d)
    if any(len(d) > 1 for d in by_name.values()):
        warnings.append("warning: a variant ran in different dtypes across these runs: "
                        + "; ".join(f"{n}: {sorted(map(str, d))}" for n, d in by_name.items() if len(d) > 1))
    zero = {"latency": "+0%", "pp": "0pp"}  # each metric's own unit: a bare number is refused for these
    known = known_metrics()
    specs = parse_margins({m: zero.get(known.get(m, ("abs",))[0], "0") for m in (metrics or default_metrics())},
                          "--metric")
    rows = []
    for r in runs:  # each candidate's first level beside the baseline's, a variant at a time
        for v, tests in ledger_tests(ledger, r["id"], ledger.baseline(r["id"]), specs).items():
            for _, _, ms, t in tests:
                iv = t.interval(0.05) if t.n >= 2 else None
                se = _se(t)
                rows.append({"run": r["id"], "variant": v, "metric": ms.metric, "pairs": t.n,
                             "estimate": t.estimate, "ci95": list(iv) if iv else None, "se": se,
                             "unit": ms.unit})
    pooled = []
    for v, metric in dict.fromkeys((x["variant"], x["metric"]) for x in rows):
        xs = [x for x in rows if x["variant"] == v and x["metric"] == metric and x["estimate"] is not None]
        if len(xs) < 2:
            continue
        ests = [x["estimate"] for x in xs]
        mu = sum(ests) / len(ests)
        sd_between = math.sqrt(sum((e - mu) ** 2 for e in ests) / (len(ests) - 1))
        half = float(stdtrit(len(ests) - 1, 0.975)) * sd_between / math.sqrt(len(ests))
        within = mean([x["se"] for x in xs])
        pooled.append({"variant": v, "metric": metric, "runs": len(xs), "pooled": mu,
                       "between_run_ci95": [mu - half, mu + half], "between_run_sd": sd_between,
                       "within_run_se": within, "unit": xs[0]["unit"]})
    return {"runs": [r["id"] for r in runs], "warnings": warnings, "per_run": rows, "pooled": pooled}


def compare_lines(c: dict[str, Any]) -> list[str]:
    out = list(c["warnings"])
    for p in c["pooled"]:
        u = {"%": " %", "pp": " pp", "abs": ""}.get(p["unit"], "")
        lo, hi = p["between_run_ci95"]
        out.append(f"{p['variant']} {p['metric']}: {p['pooled']:+.3g}{u} pooled over {p['runs']} runs, between-run "
                   f"95 % interval [{lo:+.3g}, {hi:+.3g}]{u}; between-run SD {p['between_run_sd']:.3g}{u} vs "
                   f"within-run SE {p['within_run_se'] if p['within_run_se'] is None else round(p['within_run_se'], 4)}")
    return out

