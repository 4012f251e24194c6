"""The verdicts' error rates and power, through the real verdict code: for each kind of margin
(%, ms, absolute, pp), each number of pairs and each true effect, the share of simulated runs that
end in each verdict. At the margin any verdict but "inconclusive" is wrong; at 0 "superior" is.

    python benchmarks/verdict_boundary.py [--sims 1000]

The table in docs/verdicts.md was printed by this script (seeded: the same numbers every time).
"""

from __future__ import annotations

import argparse
import time

from evalkit.reporting.verdicts import parse_margins, verdicts
from evalkit.testing.verdict_sim import SCENARIOS, rows

PAIRS = (7, 12, 24, 48, 96)
# true effects per unit: at the margin, no difference, and two improvements
EFFECTS = {"%": (5.0, 0.0, -5.0, -15.0), "ms": (50.0, 0.0, -50.0, -150.0), "abs": (0.1, 0.0, -0.1, -0.25),
           "pp": (-10.0, 0.0, 5.0, 10.0)}
VERDICTS = ("superior", "non-inferior", "inconclusive", "inferior")


def cell(unit: str, n: int, effect: float, sims: int) -> dict[str, float]:
    metric, text = SCENARIOS[unit]
    spec = parse_margins({metric: text})
    counts = dict.fromkeys(VERDICTS, 0)
    for k in range(sims):
        # pass rates: 10 % of cases gain, the losses set the effect (the harder all-losses case is
        # enumerated exactly in tests/test_verdict_boundary.py)
        counts[verdicts(rows(unit, n, effect, 10_000 * n + k, gain=0.1), "base", spec)[0]["verdict"]] += 1
    return {v: counts[v] / sims for v in VERDICTS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000)
    a = ap.parse_args()
    t0 = time.monotonic()
    print("| margin | pairs | true difference | superior | non-inferior | inconclusive | inferior | wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for unit in SCENARIOS:
        metric, text = SCENARIOS[unit]
        m = parse_margins({metric: text})[0].value
        for n in PAIRS:
            for effect in EFFECTS[unit]:
                r = cell(unit, n, effect, a.sims)
                wrong = (1 - r["inconclusive"]) if effect == m else r["superior"] if effect == 0 else None
                print(f"| {metric} {text} | {n} | {effect:+g} | " + " | ".join(f"{100 * r[v]:.1f} %" for v in VERDICTS)
                      + f" | {'-' if wrong is None else f'{100 * wrong:.1f} %'} |", flush=True)
    print(f"\n{a.sims} simulated runs per row, {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
