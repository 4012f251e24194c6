"""How small a difference each quality instrument can see (issue 26): for runs of
`evalkit run --matrix drift-control --limit N` (W8A8 and the RTN-4 control against bf16), per
candidate and instrument, the estimate against its floor with a 95 % interval, the minimum
detectable effect (two-sided 5 %, 80 % power: 2.80 x the bootstrap standard error of the per-case
differences) and the verdict it reaches:

- embedding drift: 1 − cosine against the baseline's answer, minus the baseline's noise floor;
- KL: teacher-forced KL per token, minus the baseline's batching floor;
- top-1 agreement: percentage points of answer tokens, minus the floor's;
- flips: schema and persona flip rates minus the baseline's own between its two passes (paired,
  Tango's exact score test at 95 %).

With `--margins`, the verdict each reaches against a margin too (every margin of a variant in one
Holm family, as `evalkit report --margins` does).

    python benchmarks/divergence_sensitivity.py --ledger drift.db [--run RUN ...] \
        [--margins drift=0.1,kl=0.1,top1_agreement=-10,flips_max=10pp]       # Markdown on stdout
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from evalkit.grading import paired_differences
from evalkit.grading.registry import available
from evalkit.host import host_line
from evalkit.ledger import open_ledger
from evalkit.reporting.findings import request_rows
from evalkit.reporting.flips import _passes
from evalkit.reporting.selection import first_level
from evalkit.reporting.verdicts import grader_values, parse_margins, verdicts
from evalkit.stats import PairedProportions, SignFlipMean, min_detectable


def _fmt(x: float | None, d: int = 4) -> str:
    return "-" if x is None else f"{x:+.{d}g}"


def paired(rows: list[dict[str, Any]], base: str, variant: str, grader: str, margin: str) -> list[float]:
    agg = available()[grader].aggregate
    return paired_differences(agg, grader_values(rows, variant, grader), grader_values(rows, base, grader)).get(margin, [])


def mean_line(name: str, diffs: list[float], above: str, below: str, digits: int = 3) -> dict[str, Any]:
    t = SignFlipMean(diffs)
    ci = t.interval(0.05, (0.0,)) if t.n >= 2 else None
    mde = min_detectable(diffs)
    if ci is None:
        v = "n/a"
    elif ci[0] > 0:
        v = above
    elif ci[1] < 0:
        v = below
    else:
        v = "within the floor" + (f" (could detect ≥ {mde:.{digits}g})" if mde is not None else "")
    return {"measure": name, "pairs": t.n, "estimate": t.estimate, "ci": ci, "mde": mde, "verdict": v}


def _floor_repeat(rows: list[dict[str, Any]], baseline: str) -> int | None:
    """The baseline's first noise-floor pass (the repeat no candidate sent), if it has one."""
    mine = {r["repeat"] for r in rows if r["variant"] == baseline}
    others = {r["repeat"] for r in rows if r["variant"] != baseline}
    extra = sorted(mine - others)
    return extra[0] if extra and others else None


def flips_line(rows: list[dict[str, Any]], base: str, variant: str, grader: str) -> dict[str, Any] | None:
    """The candidate's flips against the baseline's own (its floor pass), paired by case."""
    rep = _floor_repeat(rows, base)
    if rep is None:
        return None
    b0 = _passes(rows, base, grader, None)
    floor, cand = _passes(rows, base, grader, None, rep), _passes(rows, variant, grader, None)
    cases = sorted(set(b0) & set(floor) & set(cand))
    fc = [b0[c] != cand[c] for c in cases]
    ff = [b0[c] != floor[c] for c in cases]
    t = PairedProportions.from_pairs(fc, ff)
    ci = t.interval(0.05, (0.0,)) if t.n >= 2 else None
    d = [float(a) - float(b) for a, b in zip(fc, ff, strict=True)]
    sd = math.sqrt(sum((x - sum(d) / len(d)) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else None
    mde = None if sd is None else 100 * 2.80 * sd / math.sqrt(len(d))
    v = "n/a" if ci is None else "more flips than the baseline's own" if ci[0] > 0 else \
        "fewer flips than the baseline's own" if ci[1] < 0 else \
        "within the floor" + (f" (could detect ≥ {mde:.0f} pp)" if mde is not None else "")
    return {"measure": f"{grader} flips − floor (pp; {100 * sum(fc) / len(fc):.0f} % vs {100 * sum(ff) / len(ff):.0f} %)",
            "pairs": t.n, "estimate": t.estimate, "ci": ci, "mde": mde, "verdict": v}


MARGIN_OF = {"drift": "drift", "KL": "kl", "top-1": "top1_agreement", "schema": "schema_flips",
             "persona": "persona_flips"}


def table(ledger: Path, runs: list[str], margins: str | None = None) -> list[str]:
    db = open_ledger(ledger, create=False)
    out = ["| run | cases | variant | instrument | estimate − floor | 95 % CI | detectable (80 %) | verdict vs floor |"
           + (" margin verdict |" if margins else ""), "|---|---|---|---|---|---|---|---|" + ("---|" if margins else "")]
    hosts = set()
    for run in runs:
        run_row = db.require_run(run)
        hosts.add(host_line(db.host(run_row.get("host_id"))))
        base = db.baseline(run) or ""
        rows = first_level(request_rows(db, run))
        vs = verdicts(rows, base, parse_margins(margins)) if margins else []
        for v in sorted({r["variant"] for r in rows} - {base}):
            lines = [mean_line("drift (1 − cos)", paired(rows, base, v, "drift", "drift"), "above the floor",
                               "below the floor"),
                     mean_line("KL (nats/token)", paired(rows, base, v, "divergence", "kl"), "above the floor",
                               "below the floor", 2),
                     mean_line("top-1 agreement (pp)", paired(rows, base, v, "divergence", "top1_agreement"),
                               "more agreement than the floor", "less agreement than the floor")]
            lines += [x for g in ("schema", "persona") if (x := flips_line(rows, base, v, g))]
            for e in lines:
                ci = "-" if not e["ci"] else f"[{_fmt(e['ci'][0], 3)}, {_fmt(e['ci'][1], 3)}]"
                mde = "-" if e["mde"] is None else f"{e['mde']:.3g}"
                line = (f"| {run} | {run_row['n_cases']} | {v} | {e['measure']} | {_fmt(e['estimate'], 3)} | {ci} | "
                        f"{mde} | {e['verdict']} |")
                if margins:
                    metric = MARGIN_OF.get(e["measure"].split(" ")[0])
                    m = next((x for x in vs if x["variant"] == v and x["metric"] == metric), None)
                    line += f" {m['verdict']} ({m['margin_text']}: {_fmt(m['estimate'], 3)})" if m else " - |"
                    line += " |" if m else ""
                out.append(line)
    return [*sorted(hosts), "", *out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", type=Path, required=True)
    ap.add_argument("--run", action="append", help="run id (repeatable) [default: every complete drift-control run]")
    ap.add_argument("--margins", default=None, help="e.g. drift=0.1,kl=0.1,top1_agreement=-10,flips_max=10pp")
    a = ap.parse_args()
    db = open_ledger(a.ledger, create=False)
    runs = a.run or [r for r in db.run_ids("drift-control") if db.require_run(r)["status"] == "complete"]
    print("\n".join(table(a.ledger, runs, a.margins)))


if __name__ == "__main__":
    main()
