"""The paired data a verdict tests, with what would otherwise vanish from it kept in.

- **Failures count** (latency): a failed request takes the worst value either variant showed on
  any case of the comparison (the slowest latency, the lowest throughput): a candidate that times
  out on its slowest cases is not made faster by losing them. Repeats are averaged after that, so
  a case that failed one repeat of two is half a worst value. The verdict line says how many
  requests of each side were failed.
- **Blocks are the pairs** where the variants alternated in blocks of several cases (a loaded
  level's chunks, `--order blocks`: `execution/order.py`): the cases of one block ran under one
  state of the machine, so they are one pair between them, not many. A block's value is the sum of
  its cases' values for a ratio of means (so the estimate is the cases' own ratio) and their mean
  for a mean difference; the test's n is the number of blocks. Where each case is its own group (one
  request at a time, alternated) or nothing was alternated, the pairs are the cases.
- **Samples are weighted** (grades): with `--grade-sample` each slice (load level × complexity)
  keeps up to N cases, so a small slice is graded whole and a large one thinly. Its graded cases
  then stand for every case of their slice: each slice's weight is its share of the population
  (the cases both variants answered), and the estimate is the stratified one (`stats.robust`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def blocked(rows: list[dict[str, Any]]) -> bool:
    """Whether the rows' pairs are blocks: every row carries its alternation block and some block
    holds more than one case (a case per block is a pair per case)."""
    first: dict[tuple[Any, Any], str] = {}
    many = False
    for r in rows:
        b = r.get("order_block")
        if b is None:
            return False
        c = first.setdefault((r.get("level"), b), r["case_id"])
        many = many or c != r["case_id"]
    return many


def latency_pairs(rows: list[dict[str, Any]], baseline: str, variant: str, field: str, higher_is_better: bool,
                  repeats: set[int] | None = None, blocks: str | None = None
                  ) -> tuple[list[float], list[float], dict[str, int]]:
    """(candidate per case, baseline per case, failed requests per side) on the cases both variants
    sent, failed requests imputed with the worst value observed. ``blocks`` ("sum" or "mean"), where
    the rows are `blocked`: one value per block instead, its cases' values summed or averaged."""
    vals: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    unit: dict[str, tuple[Any, Any]] = {}
    for r in rows:
        if r["variant"] not in (variant, baseline) or (repeats is not None and r["repeat"] not in repeats):
            continue
        unit.setdefault(r["case_id"], (r.get("level"), r.get("order_block")))
        if r["error_class"] is not None:
            vals[(r["variant"], r["case_id"])].append(None)
        elif r[field] is not None:
            vals[(r["variant"], r["case_id"])].append(float(r[field]))
    seen = [x for xs in vals.values() for x in xs if x is not None]
    if not seen:
        return [], [], {"candidate": 0, "baseline": 0}
    worst = min(seen) if higher_is_better else max(seen)
    cases = sorted({c for v, c in vals if v == variant} & {c for v, c in vals if v == baseline})
    fails = {"candidate": 0, "baseline": 0}
    a: list[float] = []
    b: list[float] = []
    for c in cases:
        ca, cb = vals[(variant, c)], vals[(baseline, c)]
        fails["candidate"] += sum(x is None for x in ca)
        fails["baseline"] += sum(x is None for x in cb)
        a.append(sum(worst if x is None else x for x in ca) / len(ca))
        b.append(sum(worst if x is None else x for x in cb) / len(cb))
    if blocks is None or not blocked(rows):
        return a, b, fails
    return (*by_blocks(a, b, [unit[c] for c in cases], blocks), fails)


def by_blocks(a: list[float], b: list[float], units: list[tuple[Any, Any]], blocks: str
              ) -> tuple[list[float], list[float]]:
    """Per-case values (each case's (level, block) in ``units``) as one value per block: its cases'
    values summed (``blocks`` "sum") or averaged ("mean"), the blocks in a fixed order."""
    groups: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i, u in enumerate(units):
        groups[u].append(i)
    div = (lambda ix: 1) if blocks == "sum" else len
    keys = sorted(groups, key=str)
    return ([sum(a[i] for i in groups[k]) / div(groups[k]) for k in keys],
            [sum(b[i] for i in groups[k]) / div(groups[k]) for k in keys])


def imputed_means(sides: list[tuple[float, int, int]], worst: float) -> list[float]:
    """Each case's mean from (sum of its successful values, their count, its failed requests), a
    failed request at ``worst`` (what `latency_pairs` averages, reduced by the ledger)."""
    return [(s + f * worst) / (n + f) for s, n, f in sides]


def stratum(r: dict[str, Any]) -> str:
    return f"{r.get('concurrency')}/{r.get('complexity') or '-'}"


def grade_strata(rows: list[dict[str, Any]], baseline: str, variant: str, cases: list[str]
                 ) -> tuple[list[str], dict[str, float], dict[str, int]] | None:
    """For graded cases ``cases``: each one's slice, each slice's weight (its cases in the
    population) and size, or None when every slice is graded in the same share (the plain mean
    is then the stratified one)."""
    of: dict[str, str] = {}
    pop: dict[str, set[str]] = defaultdict(set)
    answered: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r["variant"] in (variant, baseline) and r["error_class"] is None:
            answered[r["case_id"]].add(r["variant"])
            of.setdefault(r["case_id"], stratum(r))
    for c, vs in answered.items():
        if len(vs) == 2:
            pop[of[c]].add(c)
    return weighted(of, {h: len(cs) for h, cs in pop.items()}, cases)


def weighted(of: dict[str, str], pop: dict[str, int], cases: list[str]
             ) -> tuple[list[str], dict[str, float], dict[str, int]] | None:
    """`grade_strata` from each answered case's slice (``of``) and each slice's population."""
    labels = [of.get(c, "-") for c in cases]
    kept: dict[str, int] = defaultdict(int)
    for h in labels:
        kept[h] += 1
    sizes = {h: max(pop.get(h, 0), kept[h]) for h in kept}
    shares = {kept[h] / sizes[h] for h in kept}
    if len(shares) <= 1:
        return None
    return labels, {h: float(sizes[h]) for h in kept}, sizes


def weights_text(strata: tuple[list[str], dict[str, float], dict[str, int]] | None) -> str | None:
    """How a verdict says it weighted a sample: 'weighted by slice: 1/short 400 cases (40 graded), …'."""
    if strata is None:
        return None
    labels, _, sizes = strata
    kept: dict[str, int] = defaultdict(int)
    for h in labels:
        kept[h] += 1
    total = sum(sizes.values())
    return "weighted to the population by slice (level/complexity: weight, graded of cases): " + ", ".join(
        f"{h}: {sizes[h] / total:.3f}, {kept[h]} of {sizes[h]}" for h in sorted(sizes))
