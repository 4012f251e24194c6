"""Grading a stated, stratified sample of a run far larger than its quality question needs.

A slice is a load level × complexity (the report's quality tables are per complexity, a sweep's
per level). In each slice the sample keeps up to N cases, chosen by a seeded hash of the case id,
and grades every variant's every repeat of each kept case: pairs stay pairs (drift and divergence
compare a candidate with the baseline on the same case and seed, and drift's noise floor reads
the baseline's extra repeats), the choice does not depend on the order rows were written, and
grading again (a new grader version, a resumed run) grades the same requests.

A slice graded thinly stands for more cases than one graded whole: the verdicts weight each slice
by its share of the population (the stratified estimator and its variance, `stats.robust`;
`reporting/pairing.py` reads the slices from the graded rows), and the report states the weights.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .base import GradedRequest

STRATA = ("level", "complexity")


@dataclass(frozen=True)
class GradeSample:
    """Up to ``per_slice`` cases per slice (`STRATA`), chosen with ``seed``."""

    per_slice: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per_slice < 1:
            raise ValueError("a grade sample keeps at least one case per slice")

    def choose(self, items: list[GradedRequest]) -> tuple[list[GradedRequest], dict[str, Any]]:
        """The sampled items (every variant's requests for each kept case) and what the sample was."""
        keys: dict[tuple[str, str], set[str]] = defaultdict(set)
        for i in items:
            keys[(i.level, i.case.complexity or "-")].add(i.case.id)
        kept: set[tuple[str, str]] = set()
        strata = []
        for (level, complexity), ks in sorted(keys.items()):
            chosen = sorted(ks, key=self._rank)[: self.per_slice]
            kept.update((level, c) for c in chosen)
            strata.append({"level": level, "complexity": complexity, "cases": len(ks), "kept": len(chosen)})
        sampled = [i for i in items if (i.level, i.case.id) in kept]
        return sampled, {"per_slice": self.per_slice, "seed": self.seed, "strata_by": list(STRATA),
                         "requests": len(items), "graded": len(sampled), "strata": strata}

    def _rank(self, case_id: str) -> bytes:
        return hashlib.blake2b(f"{self.seed}\x1f{case_id}".encode(), digest_size=8).digest()


def sample_line(info: dict[str, Any] | None) -> str | None:
    """How the report states a sampled grading, or None when every request was graded."""
    if not info:
        return None
    full = sum(s["kept"] == s["cases"] for s in info["strata"])
    return (f"quality graded on a stratified sample: up to {info['per_slice']} cases per slice "
            f"({' × '.join(info['strata_by'])}, seed {info['seed']}), every variant's requests for each; "
            f"{info['graded']:,} of {info['requests']:,} successful requests graded; "
            f"{full} of {len(info['strata'])} slices graded whole; {weights_text(info)}")


def weights(info: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Each slice's weight in an estimate over the population: its share of the cases (of its load
    level: each level is its own population). A graded case stands for cases / kept of its slice."""
    per_level: dict[str, int] = defaultdict(int)
    for s in info["strata"]:
        per_level[s["level"]] += s["cases"]
    return {(s["level"], s["complexity"]): s["cases"] / per_level[s["level"]] for s in info["strata"]}


def weights_text(info: dict[str, Any]) -> str:
    """'estimates weighted to the population: c=1/short 0.556 (3 of 10 graded), …' or that they need none."""
    w = weights(info)
    shares = {s["kept"] / s["cases"] for s in info["strata"] if s["cases"]}
    if len(shares) <= 1:
        return "every slice graded in the same share: plain means are the population's"
    return "verdicts and intervals weighted to the population by slice (weight, graded of cases): " + ", ".join(
        f"{s['level']}/{s['complexity']} {w[(s['level'], s['complexity'])]:.3f} ({s['kept']} of {s['cases']})"
        for s in info["strata"])
