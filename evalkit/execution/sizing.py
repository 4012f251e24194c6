"""A run sized by time or by question. `--time-budget 10m` measures this machine (the timing probes
of the first variant's warm-up) and keeps as many stratified cases as fit that time, then says what
that buys: the smallest drift and latency difference the run can detect (two-sided 5 %, 80 %
power). `evalkit plan` (reporting.plan) answers the reverse question from a pilot run.

The per-case spread that turns a case count into a detectable difference comes from an earlier
run of the same matrix in the ledger when there is one, else from the shipped priors below
(measured on the embedded default run; docs/verdicts.md)."""

from __future__ import annotations

import math
import re
import time
from typing import Any

from ..errors import UsageError
from ..grading.margins import hypotheses, pairs_needed, parse_margins
from ..ledger import dumps
from ..stats import Z_DETECT, pairs_for_a_verdict
from .estimate import RunEstimate

# Per-case SD of the paired difference (candidate − baseline), from the embedded default run
# (README): drift − noise floor in 1 − cosine units; E2E mean in % of the baseline's.
PRIORS = {"drift": 0.25, "e2e_mean": 25.0}
_DUR = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s?)?\s*$")


def parse_duration(text: str, flag: str = "--time-budget") -> float:
    """`10m`, `90s`, `1h30m`, `600` (seconds) -> seconds."""
    m = _DUR.match(text or "")
    if not text or not m or not any(m.groups()):
        raise UsageError(f"{flag}: '{text}' is not a duration (e.g. 10m, 90s, 1h30m)")
    h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    total = h * 3600 + mi * 60 + s
    if total <= 0:
        raise UsageError(f"{flag}: a duration must be positive")
    return total


def mmss(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def mde(sd: float, n: int) -> float:
    """Smallest true mean difference a two-sided 5 % test on n pairs detects with 80 % power."""
    return Z_DETECT * sd / math.sqrt(max(1, n))


def cases_needed(sd: float, delta: float, between_sd: float = 0.0) -> int | None:
    """Pairs needed to detect ``delta`` at 80 % power; with a between-run spread the run's own
    mean cannot be pinned closer than it, so a delta below Z x between_sd is out of reach (None)."""
    room = delta ** 2 - (Z_DETECT * between_sd) ** 2
    if room <= 0:
        return None
    return max(2, math.ceil((Z_DETECT * sd) ** 2 / room))


def balanced(n: int, available: int) -> int:
    """Round down to whole rounds of the six (task x complexity) strata, at least one per complexity."""
    n = min(n, available)
    if n >= 6:
        return n - n % 6
    return max(3, n - n % 3) if available >= 3 else available


def fit_time(budget_s: float, elapsed_s: float, per_request_s: float, requests_per_case: float,
               fixed_s: float, available: int) -> int:
    """How many cases fit what is left of the time budget: the measured requests at the estimated
    per-request time, after the fixed costs still ahead (the other variants' starts and warm-ups,
    grading)."""
    left = budget_s - elapsed_s - fixed_s
    per_case = max(1e-6, per_request_s * requests_per_case)
    return balanced(max(3, int(left // per_case)), available)


def paired_diffs(ledger: object, run_id: str) -> dict[str, dict[str, list[float]]]:
    """Per candidate variant of a run: its per-case paired differences against the baseline, for
    drift (drift − noise floor, from the drift grader) and E2E mean (% of the baseline's mean),
    at the run's first load level, each case's repeats averaged."""
    from ..grading import paired_differences
    from ..grading.registry import available

    base = ledger.baseline(run_id)  # type: ignore[attr-defined]
    rows = ledger.measured_requests(run_id, ok_only=True)  # type: ignore[attr-defined]
    if not base or not rows:
        return {}
    low = min((r["concurrency"] or 1) for r in rows)
    rows = [r for r in rows if (r["concurrency"] or 1) == low]
    grades = ledger.latest_grades(run_id)  # type: ignore[attr-defined]
    out: dict[str, dict[str, list[float]]] = {}
    for v in sorted({r["variant"] for r in rows} - {base}):
        reps = {r["repeat"] for r in rows if r["variant"] == v} & {r["repeat"] for r in rows if r["variant"] == base}
        a, b = _case_means(rows, v, reps), _case_means(rows, base, reps)
        cases = sorted(set(a) & set(b))
        scale = 100.0 / (sum(b[c] for c in cases) / len(cases)) if cases else 1.0
        d = {"e2e_mean": [(a[c] - b[c]) * scale for c in cases]}
        if "drift" in available():
            def g(var: str) -> list[dict]:
                return [{**grades[r["id"]]["drift"], "case_id": r["case_id"], "repeat": r["repeat"]} for r in rows
                        if r["variant"] == var and "drift" in grades.get(r["id"], {})]

            d["drift"] = paired_differences(available()["drift"].aggregate, g(v), g(base)).get("drift", [])
        out[v] = d
    return out


def _case_means(rows: list[dict], variant: str, repeats: set[int]) -> dict[str, float]:
    acc: dict[str, list[float]] = {}
    for r in rows:
        if r["variant"] == variant and r["e2e_ms"] and r["repeat"] in repeats:
            acc.setdefault(r["case_id"], []).append(r["e2e_ms"])
    return {c: sum(x) / len(x) for c, x in acc.items()}


def spread(diffs: dict[str, dict[str, list[float]]]) -> dict[str, tuple[float, int]]:
    """metric -> (SD of the per-case differences, pairs), pooled over candidate variants."""
    out = {}
    for metric in ("drift", "e2e_mean"):
        sds = []
        for d in diffs.values():
            xs = d.get(metric) or []
            if len(xs) >= 3:
                m = sum(xs) / len(xs)
                sds.append((math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)), len(xs)))
        if sds:
            n = sum(k for _, k in sds)
            out[metric] = (math.sqrt(sum(s * s * k for s, k in sds) / n), n)
    return out


def earlier_spread(ledger: object, matrix_name: str, exclude: str) -> tuple[dict[str, tuple[float, int]], str | None]:
    """The per-case spread of the latest earlier complete run of the same matrix, if any."""
    for rid in reversed(ledger.run_ids(matrix_name)):  # type: ignore[attr-defined]
        if rid != exclude and ledger.require_run(rid)["status"] == "complete":  # type: ignore[attr-defined]
            s = spread(paired_diffs(ledger, rid))
            if s:
                return s, rid
    return {}, None


def margin_floor(margins: dict[str, Any]) -> tuple[int, int]:
    """A matrix's margins: how many hypotheses each variant's Holm family holds, and the fewest
    pairs at which every margin can be decided: the verdicts' own answer (`grading.margins`), so
    the budget and the report never disagree."""
    specs = parse_margins(margins, where="matrix margins")
    return (hypotheses(specs), pairs_needed(specs)) if specs else (0, 0)


def buys(n: int, spreads: dict[str, tuple[float, int]], source: str, n_hypotheses: int = 0, need: int = 0,
         room: int | None = None) -> str:
    """What n pairs can detect, per metric, and whether they can decide the matrix's margins at all."""
    parts = []
    for metric, unit in (("drift", ""), ("e2e_mean", " %")):
        sd = spreads.get(metric, (PRIORS[metric], 0))[0]
        parts.append(f"{metric} {mde(sd, n):.3g}{unit}")
    line = f"with {n} cases per variant this run can detect (80 % power, 5 % two-sided): {', '.join(parts)} ({source})"
    need = max(need, pairs_for_a_verdict(n_hypotheses) if n_hypotheses else 0)
    if n_hypotheses and n < need:
        more = f"; the dataset has {room}" if room is not None and room < need else ": a larger --time-budget"
        line += (f"; too few to decide every margin ({n_hypotheses} hypotheses under Holm: at least {need} cases "
                 f"before each can be decided{more})")
    return line


def size_to_budget(ctx: Any, est: RunEstimate | None, variants_after: int, servers: dict[str, Any]) -> set[str]:
    """`--time-budget`: keep the stratified prefix of cases that fits what is left of the time on
    this machine (from the first variant's timing probes), for every variant; say what it buys.
    The decision lives in the run's context (``ctx``: `runner.RunContext`): its cases are cut to the
    ones kept and ``ctx.sized`` says how many."""
    ledger, run_id, matrix, cases, repeats, summary = ctx.ledger, ctx.run_id, ctx.matrix, ctx.cases, ctx.repeats, ctx.summary
    budget_s = ctx.time_budget_s
    assert budget_s is not None
    start_s = max((s.stage_s.get("start", 0.0) for s in servers.values()), default=0.0)
    warm_s = max((summary.stages.get(n, {}).get("warm-up", 0.0) for n in summary.stages), default=0.0)
    reqs_per_case = sum(matrix.generation.baseline_passes(repeats) if v.name == matrix.baseline else repeats
                        for v in matrix.variants)
    per_req = (est.measure_s / est.n_requests) if est is not None and est.n_requests else 10.0
    per_req += 0.03  # grading, per output
    n = fit_time(budget_s, time.monotonic() - summary.t0, per_req, reqs_per_case,
                   variants_after * (start_s + warm_s), len(cases))
    stretched = short = ""
    hyp, floor = margin_floor(matrix.margins)
    per_pair = ctx.load.cases_per_pair()  # a pair is a case, or an alternation chunk of a loaded level
    blocks = f" (each pair a block of {per_pair} cases: {floor * per_pair} cases)" if per_pair > 1 else ""
    need = floor * per_pair + (-floor * per_pair) % 6  # whole rounds of the six strata
    if need > len(cases) and hyp:  # no budget decides them: the dataset itself is too small, and the line says so
        short = (f"; the margins need at least {floor} pairs{blocks} to be decided ({hyp} hypotheses under Holm; "
                 f"docs/verdicts.md) and the dataset has {len(cases)} cases: no time budget decides them here")
    elif n < need:  # a run that cannot decide its margins answers nothing: the budget gives way, and says so
        stretched = (f"; stretched to {need} cases, the fewest at which every margin can be decided ({hyp} hypotheses "
                     f"under Holm; docs/verdicts.md): about {mmss((need - n) * per_req * reqs_per_case)} past the budget")
        n = need
    kept = ctx.cases = cases[:n]  # the later variants send the same cases
    ledger.update_run(run_id, {"n_cases": n, "case_ids_json": dumps([c.id for c in kept])})
    spreads, pilot = earlier_spread(ledger, matrix.name, run_id)
    ctx.sized = n
    speeds = f", {est.basis}" if est is not None else ""
    ctx.progress.say(f"time budget {mmss(budget_s)}: {n} cases {'kept' if stretched else 'fit'} on this machine "
                     f"(at most {mmss(per_req * reqs_per_case)} per case across {len(matrix.variants)} variants{speeds})"
                     f"{stretched}{short}; "
                     + buys(n, spreads, f"spread from run {pilot}" if pilot else "shipped priors; `evalkit plan` "
                            "refines them from this run", hyp, need, len(cases)))
    return {c.id for c in kept}


