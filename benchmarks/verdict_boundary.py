"""The verdicts' error rates and power, through the real verdict code: for each kind of margin
(%, ms, absolute, pp, KL), each shape of data (`verdict_sim.SHAPES`), each number of pairs and
each true effect, the share of simulated runs that end in each verdict. At the margin any verdict
but "inconclusive" is wrong; at 0 "superior" is. Also a graded sample of unequal slices and a
sweep of four levels in one family.

    python benchmarks/verdict_boundary.py [--sims 1000] [--shapes] [--pairs 12,24,48,96]

The tables in docs/verdicts.md were printed by this script (seeded: the same numbers every time).
"""

from __future__ import annotations

import argparse
import time

from scipy.stats import beta

from evalkit.reporting.verdicts import parse_margins, verdicts
from evalkit.testing.verdict_sim import SCENARIOS, SHAPES, rows, strata_rows, sweep_rows

PAIRS = (7, 12, 24, 48, 96)
# true effects per unit: at the margin, no difference, and two improvements
EFFECTS = {"%": (5.0, 0.0, -5.0, -15.0), "ms": (50.0, 0.0, -50.0, -150.0), "abs": (0.1, 0.0, -0.1, -0.25),
           "pp": (-10.0, 0.0, 5.0, 10.0)}
VERDICTS = ("superior", "non-inferior", "inconclusive", "inferior")


def cell(unit: str, n: int, effect: float, sims: int, shape: str = "gauss") -> dict[str, float]:
    metric, text = SCENARIOS[unit]
    spec = parse_margins({metric: text})
    counts = dict.fromkeys(VERDICTS, 0)
    for k in range(sims):
        # pass rates: 10 % of cases gain, the losses set the effect (the harder all-losses case is
        # enumerated exactly in tests/test_verdict_boundary.py)
        counts[verdicts(rows(unit, n, effect, 10_000 * n + k, gain=0.1, shape=shape), "base", spec)[0]["verdict"]] += 1
    return {v: counts[v] / sims for v in VERDICTS}


def exact_ci(k: int, n: int) -> str:
    """Clopper-Pearson 95 % interval of a simulated rate, in %."""
    lo = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
    hi = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
    return f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def shapes_table(sims: int, pairs: tuple[int, ...], units: tuple[str, ...], only: tuple[str, ...] = ()) -> None:
    print("| margin | shape | pairs | wrong at the margin | superior at no difference |")
    print("|---|---|---|---|---|")
    for unit, shapes in SHAPES.items():
        if unit not in units:
            continue
        metric, text = SCENARIOS[unit]
        m = parse_margins({metric: text})[0].value
        for shape in shapes:
            if (shape == "gauss" and unit != "ms") or (only and shape not in only):  # the Gaussian table has these
                continue
            for n in pairs:
                at = cell(unit, n, m, sims, shape)
                zero = cell(unit, n, 0.0, sims, shape)
                print(f"| {metric} {text} | {shape} | {n} | {exact_ci(round(sims * (1 - at['inconclusive'])), sims)} | "
                      f"{exact_ci(round(sims * zero['superior']), sims)} |", flush=True)
    if "strata" not in units:
        return
    spec = parse_margins({"schema_pass": "-5pp"})
    wrong = sum(verdicts(strata_rows(-5.0, 50_000 + k), "base", spec)[0]["verdict"] != "inconclusive"
                for k in range(sims))
    print(f"| schema_pass -5pp | graded sample: 400 short + 40 long cases, 40 graded a slice, losses on long only "
          f"| 80 | {exact_ci(wrong, sims)} | - |", flush=True)
    spec = parse_margins({"ttft_mean": "+50ms"})
    for n in (12, 48):
        wrong = sum(any(e["verdict"] != "inconclusive" for e in verdicts([], "base", spec, levels=sweep_rows("ms", n,
                    50.0, 60_000 + k))) for k in range(sims))
        print(f"| ttft_mean +50ms | sweep of 4 levels, one family (wrong at any level) | {n} | {exact_ci(wrong, sims)} "
              "| - |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--shapes", action="store_true", help="the shapes table (wrong verdicts per shape) only")
    ap.add_argument("--pairs", default=None, help="comma-separated pair counts")
    ap.add_argument("--units", default=",".join([*SHAPES, "strata"]),
                    help="the shapes table's margins (strata: the graded sample and the sweep)")
    ap.add_argument("--only", default="", help="comma-separated shapes to run (default: all)")
    a = ap.parse_args()
    t0 = time.monotonic()
    pairs = tuple(int(x) for x in a.pairs.split(",")) if a.pairs else PAIRS
    if a.shapes:
        shapes_table(a.sims, pairs, tuple(a.units.split(",")), tuple(x for x in a.only.split(",") if x))
        print(f"\n{a.sims} simulated runs per cell, {time.monotonic() - t0:.0f} s")
        return
    print("| margin | pairs | true difference | superior | non-inferior | inconclusive | inferior | wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for unit in EFFECTS:
        metric, text = SCENARIOS[unit]
        m = parse_margins({metric: text})[0].value
        for n in pairs:
            for effect in EFFECTS[unit]:
                r = cell(unit, n, effect, a.sims)
                wrong = (1 - r["inconclusive"]) if effect == m else r["superior"] if effect == 0 else None
                print(f"| {metric} {text} | {n} | {effect:+g} | " + " | ".join(f"{100 * r[v]:.1f} %" for v in VERDICTS)
                      + f" | {'-' if wrong is None else f'{100 * wrong:.1f} %'} |", flush=True)
    print(f"\n{a.sims} simulated runs per row, {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
