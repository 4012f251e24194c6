"""Seeded data at a chosen true difference, shaped like a run's rows, for proving the verdicts'
error rates through the real verdict code (tests/test_verdict_boundary.py, benchmarks/verdict_boundary.py).

One scenario per kind of margin, each with a true difference the caller sets in the margin's unit:

- ``%``: e2e_mean, a ratio of means: candidate = (1 + effect/100) x baseline + noise (baseline
  latencies from 400 ms to 4 s, noise 20 % of the baseline's own value);
- ``ms``: ttft_mean, a mean difference: candidate = baseline + effect + N(0, 120 ms);
- ``abs``: drift − noise floor per case (the drift grader's own rows), floor 0.3–0.6, SD 0.25;
- ``pp``: schema pass rate, paired by case: the candidate gains a pass with probability ``gain``
  and loses one with probability ``gain - effect/100`` (at gain 0: loses only, the hardest case).
"""

from __future__ import annotations

import random
from typing import Any

SCENARIOS: dict[str, tuple[str, str]] = {
    "%": ("e2e_mean", "+5%"),
    "ms": ("ttft_mean", "+50ms"),
    "abs": ("drift", "0.1"),
    "pp": ("schema_pass", "-10pp"),
}


def _row(variant: str, case: int, **kw: Any) -> dict[str, Any]:
    return {"variant": variant, "case_id": f"c{case}", "repeat": 0, "concurrency": 1, "error_class": None,
            "ttft_ms": None, "e2e_ms": None, "tpot_ms": None, "itl_mean_ms": None, "out_tps": None, "grades": {}, **kw}


def rows(unit: str, n: int, effect: float, seed: int, gain: float = 0.0) -> list[dict[str, Any]]:
    """n cases of baseline and candidate rows whose true difference is ``effect``."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        if unit == "%":
            b = rng.uniform(400.0, 4000.0)
            c = (1 + effect / 100.0) * b + rng.gauss(0.0, 0.2 * b)
            out += [_row("base", i, e2e_ms=b), _row("cand", i, e2e_ms=max(c, 1.0))]
        elif unit == "ms":
            b = rng.uniform(200.0, 2000.0)
            out += [_row("base", i, ttft_ms=b), _row("cand", i, ttft_ms=b + effect + rng.gauss(0.0, 120.0))]
        elif unit == "abs":
            floor = rng.uniform(0.3, 0.6)
            drift = floor + effect + rng.gauss(0.0, 0.25)
            out += [_row("base", i, grades={"drift": {"value": 1 - floor, "passed": None,
                                                      "detail": {"kind": "noise_floor", "drift": floor}}}),
                    _row("cand", i, grades={"drift": {"value": 1 - drift, "passed": None,
                                                      "detail": {"kind": "drift", "drift": drift}}})]
        elif unit == "pp":
            lose = gain - effect / 100.0
            u = rng.random()
            base_pass, cand_pass = (False, True) if u < gain else (True, False) if u < gain + lose else \
                (rng.random() < 0.5,) * 2
            out += [_row("base", i, grades={"schema": {"value": float(base_pass), "passed": int(base_pass),
                                                       "detail": {}}}),
                    _row("cand", i, grades={"schema": {"value": float(cand_pass), "passed": int(cand_pass),
                                                       "detail": {}}})]
        else:
            raise ValueError(f"unknown unit {unit!r} (known: {', '.join(SCENARIOS)})")
    return out


def pp_rows(n: int, gains: int, losses: int) -> list[dict[str, Any]]:
    """Pass-rate rows with exactly this many gains and losses (the rest pass on both), for exact
    enumeration over every outcome a run can have."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        b, c = (False, True) if i < gains else (True, False) if i < gains + losses else (True, True)
        out += [_row("base", i, grades={"schema": {"value": float(b), "passed": int(b), "detail": {}}}),
                _row("cand", i, grades={"schema": {"value": float(c), "passed": int(c), "detail": {}}})]
    return out
