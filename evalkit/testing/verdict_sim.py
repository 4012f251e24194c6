"""Seeded data at a chosen true difference, shaped like a run's rows, for proving the verdicts'
error rates through the real verdict code (tests/test_verdict_boundary.py, benchmarks/verdict_boundary.py).

One scenario per kind of margin, each with a true difference the caller sets in the margin's unit:

- ``%``: e2e_mean, a ratio of means: candidate = (1 + effect/100) x baseline + noise (baseline
  latencies from 400 ms to 4 s, noise 20 % of the baseline's own value);
- ``ms``: ttft_mean, a mean difference: candidate = baseline + effect + N(0, 120 ms);
- ``abs``: drift − noise floor per case (the drift grader's own rows), floor 0.3–0.6, SD 0.25;
- ``pp``: schema pass rate, paired by case: the candidate gains a pass with probability ``gain``
  and loses one with probability ``gain - effect/100`` (at gain 0: loses only, the hardest case).

``shape`` swaps the noise for the shapes real data has (`SHAPES`), each with the same mean (the
true difference stays exactly ``effect``): right-skewed lognormal and spike mixtures, a noisier
candidate (unequal spread), a zero-inflated KL floor against a smooth candidate, a candidate
that fails its slowest requests, and ``real``: the cases of a real run (`real_per_case.json`,
written by benchmarks/real_per_case.py from a ledger) resampled with replacement and shifted so the
true difference (the pool's own) is exactly ``effect``. `strata_rows` draws a graded sample of unequal slices and
`sweep_rows` a sweep of several load levels.
"""

from __future__ import annotations

import json
import math
import random
from functools import cache
from pathlib import Path
from typing import Any

SCENARIOS: dict[str, tuple[str, str]] = {
    "%": ("e2e_mean", "+5%"),
    "ms": ("ttft_mean", "+50ms"),
    "abs": ("drift", "0.1"),
    "pp": ("schema_pass", "-10pp"),
    "kl": ("kl", "0.01"),
}
# noise shapes per kind of margin (gauss is the plain one above)
SHAPES: dict[str, tuple[str, ...]] = {
    "ms": ("gauss", "lognormal", "heavy", "spikes", "failures", "real"),
    "%": ("gauss", "lognormal", "unequal", "spikes", "failures", "real"),
    "abs": ("gauss", "lognormal", "heavy", "real"),
    "kl": ("zero_inflated", "lognormal", "real"),
}
REAL = Path(__file__).with_name("real_per_case.json")
_REAL_FIELD = {"%": "e2e_ms", "ms": "ttft_ms", "abs": "drift", "kl": "kl"}


@cache
def real_pool(unit: str) -> tuple[tuple[float, float], ...]:
    """A real run's (candidate, baseline) per case for this kind of margin (`real_per_case.json`)."""
    return tuple((float(c), float(b)) for c, b in json.loads(REAL.read_text(encoding="utf-8"))[_REAL_FIELD[unit]])


def _real_rows(unit: str, n: int, effect: float, rng: random.Random) -> list[dict[str, Any]]:
    """n cases resampled from a real run, the candidate shifted so the pool's true difference is
    ``effect``: a ratio of means for %, a mean difference otherwise."""
    pool = real_pool(unit)
    if unit == "%":
        scale = (1 + effect / 100.0) * sum(b for _, b in pool) / sum(c for c, _ in pool)
    else:
        shift = effect - sum(c - b for c, b in pool) / len(pool)
    out: list[dict[str, Any]] = []
    for i in range(n):
        c, b = pool[rng.randrange(len(pool))]
        if unit == "%":
            out += [_row("base", i, e2e_ms=b), _row("cand", i, e2e_ms=c * scale)]
        elif unit == "ms":
            out += [_row("base", i, ttft_ms=b), _row("cand", i, ttft_ms=c + shift)]
        elif unit == "abs":
            d = c + shift
            out += [_row("base", i, grades={"drift": {"value": 1 - b, "passed": None,
                                                      "detail": {"kind": "noise_floor", "drift": b}}}),
                    _row("cand", i, grades={"drift": {"value": 1 - d, "passed": None,
                                                      "detail": {"kind": "drift", "drift": d}}})]
        else:
            k = c + shift
            out += [_row("base", i, grades={"divergence": {"value": b, "passed": None, "detail": {
                        "kind": "floor", "status": "ok", "kl_mean": b, "top1_pct": 99.0}}}),
                    _row("cand", i, grades={"divergence": {"value": k, "passed": None, "detail": {
                        "kind": "candidate", "status": "ok", "kl_mean": k, "top1_pct": 98.0}}})]
    return out
FAIL_SHARE = 0.1  # the "failures" shape: the candidate fails its slowest 10 % of requests


def centred(rng: random.Random, shape: str, sd: float) -> float:
    """One draw of mean 0 and SD ``sd`` in a shape: right-skewed lognormal (σ 0.5, skewness 1.8;
    ``heavy``: σ 0.75, skewness 3.3),
    spikes (a quarter of the draws stall, the rest a tight body around a small speed-up)."""
    if shape in ("lognormal", "heavy"):  # heavy: σ 0.75, skewness 3.3
        sigma = 0.75 if shape == "heavy" else 0.5
        s2 = sigma ** 2
        m, v = math.exp(s2 / 2), (math.exp(s2) - 1) * math.exp(s2)
        return (rng.lognormvariate(0.0, sigma) - m) / math.sqrt(v) * sd
    if shape == "spikes":
        p, body = 0.25, sd / 3
        size = math.sqrt((sd * sd - body * body) / (p * (1 - p)))
        return size * ((rng.random() < p) - p) + rng.gauss(0.0, body)
    return rng.gauss(0.0, sd)


def _unit_mean_lognormal(rng: random.Random, sigma: float) -> float:
    return rng.lognormvariate(-sigma * sigma / 2, sigma)


def _fail_slowest(out: list[dict[str, Any]], field: str, share: float) -> None:
    """The candidate's slowest ``share`` of requests time out: no value, an error class."""
    cand = sorted((r for r in out if r["variant"] == "cand"), key=lambda r: -r[field])
    for r in cand[: round(share * len(cand))]:
        r.update({field: None, "error_class": "timeout"})


def _row(variant: str, case: int, **kw: Any) -> dict[str, Any]:
    return {"variant": variant, "case_id": f"c{case}", "repeat": 0, "concurrency": 1, "error_class": None,
            "ttft_ms": None, "e2e_ms": None, "tpot_ms": None, "itl_mean_ms": None, "out_tps": None, "grades": {}, **kw}


def rows(unit: str, n: int, effect: float, seed: int, gain: float = 0.0, shape: str = "gauss",
         level: int = 1) -> list[dict[str, Any]]:
    """n cases of baseline and candidate rows whose true difference is ``effect``."""
    rng = random.Random(seed)
    if shape == "real":
        out = _real_rows(unit, n, effect, rng)
        for r in out:
            r["concurrency"] = level
        return out
    out: list[dict[str, Any]] = []
    noise = "gauss" if shape == "failures" else shape
    for i in range(n):
        if unit == "%":
            b = rng.uniform(400.0, 4000.0)
            if shape == "unequal":  # the candidate's own noise 5 x the baseline's, both skewed, mean kept
                c = (1 + effect / 100.0) * b * _unit_mean_lognormal(rng, 0.5)
                b *= _unit_mean_lognormal(rng, 0.1)
            else:
                c = (1 + effect / 100.0) * b + b * centred(rng, noise, 0.2)
            out += [_row("base", i, e2e_ms=b), _row("cand", i, e2e_ms=c)]
        elif unit == "ms":
            b = rng.uniform(200.0, 2000.0)
            out += [_row("base", i, ttft_ms=b), _row("cand", i, ttft_ms=b + effect + centred(rng, noise, 120.0))]
        elif unit == "kl":  # per-case KL: candidate vs the baseline's floor, equal means at effect 0
            if shape == "zero_inflated":  # the floor is 0 on 60 % of cases, the candidate smooth
                fl = 0.0 if rng.random() < 0.6 else rng.expovariate(1 / 0.05)
                kl = rng.gammavariate(4.0, 0.02 / 4.0) + effect
            else:  # two lognormals of different scale, same mean
                fl = 0.02 * _unit_mean_lognormal(rng, 0.3)
                kl = (0.02 + effect) * _unit_mean_lognormal(rng, 1.0)
            out += [_row("base", i, grades={"divergence": {"value": fl, "passed": None, "detail": {
                        "kind": "floor", "status": "ok", "kl_mean": fl, "top1_pct": 99.0}}}),
                    _row("cand", i, grades={"divergence": {"value": kl, "passed": None, "detail": {
                        "kind": "candidate", "status": "ok", "kl_mean": kl, "top1_pct": 98.0}}})]
        elif unit == "abs":
            floor = rng.uniform(0.3, 0.6)
            drift = floor + effect + centred(rng, noise, 0.25)
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
    if shape == "failures":
        _fail_slowest(out, "e2e_ms" if unit == "%" else "ttft_ms", FAIL_SHARE)
    for r in out:
        r["concurrency"] = level
    return out


def sweep_rows(unit: str, n: int, effect: float, seed: int, levels: int = 4) -> list[tuple[int, list[dict[str, Any]]]]:
    """(level, rows) for a sweep of ``levels`` load levels, each at the same true difference."""
    return [(2 ** k, rows(unit, n, effect, seed * 101 + k, gain=0.1, level=2 ** k)) for k in range(levels)]


def strata_rows(effect_pp: float, seed: int, short: int = 400, long: int = 40, per_slice: int = 40
                ) -> list[dict[str, Any]]:
    """A graded sample of unequal slices: ``short`` short and ``long`` long cases, every one
    answered, ``per_slice`` of each graded. Pass/fail losses happen on long cases only, at the rate
    that makes the population's difference ``effect_pp`` (negative)."""
    rng = random.Random(seed)
    lose = -effect_pp / 100.0 * (short + long) / long
    out: list[dict[str, Any]] = []
    for i in range(short + long):
        cx = "short" if i < short else "long"
        graded = (i if i < short else i - short) < per_slice
        b = True
        c = not (cx == "long" and rng.random() < lose)
        for v, ok in (("base", b), ("cand", c)):
            g = {"schema": {"value": float(ok), "passed": int(ok), "detail": {}}} if graded else {}
            out.append(_row(v, i, e2e_ms=1000.0, complexity=cx, grades=g))
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
