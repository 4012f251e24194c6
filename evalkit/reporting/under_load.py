"""Quality under load, per variant: the highest load level against concurrency 1, case by case
(same variant, same case and repeat): how many answers stayed byte-identical and how far the
others drifted (the `load_drift` grader), and what that did to every grader that offers a margin
(schema, persona, formality, plugins): the paired difference with a 95 % interval."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..execution.patterns import REFERENCE
from ..grading import paired_differences
from ..grading.registry import aggregate_hook, available
from ..stats import bootstrap_ci, mean
from .grade_views import grade_views


def quality_under_load(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v and r["error_class"] is None]
        top = max((r["concurrency"] or 1 for r in mine), default=1)
        seq = unloaded(mine)
        load = [r for r in mine if (r["concurrency"] or 1) == top]
        if top <= 1 or not seq or not load:
            continue
        out.append(load_entry(v, top, load, seq_values(seq)))
    return out


def unloaded(rows: Iterable[Any]) -> list[Any]:
    """The rows sent one at a time: a closed loop of 1 (an open loop's rows say concurrency 1 too),
    the level named c=1 when there is one (a search's reference beside its probes)."""
    seq = [r for r in rows if (r["concurrency"] or 1) == 1 and r.get("scheduled_ms") is None]
    return [r for r in seq if r["level"] == REFERENCE] or seq


def _margin_graders() -> dict[str, Any]:
    return {name: cls.aggregate for name, cls in available().items() if cls.aggregate.margins}


def _grades(rs: list[dict[str, Any]], grader: str) -> list[dict[str, Any]]:
    # key by case and repeat: the pairing is within one variant across load levels
    if (views := grade_views(rs, grader, lambda r: f"{r['case_id']}#{r['repeat']}")) is not None:
        return views  # type: ignore[return-value]  # rows from the ledger: no dict a grade
    return [{**r["grades"][grader], "case_id": f"{r['case_id']}#{r['repeat']}"} for r in rs if grader in r["grades"]]


SEQ_CHUNK = 20_000  # grades per `margin_values` call for a built-in: its dict of them is ~3 MB, not ~30


def seq_values(seq: list[dict[str, Any]]) -> dict[str, dict[str, Mapping[str, float]]]:
    """The concurrency-1 side of every margin grader's pairs (grader -> margin -> case#repeat ->
    value): all `load_entry` needs of those rows, so a report read a level at a time lets them go."""
    return {name: side_values(agg, _grades(seq, name), True) for name, agg in _margin_graders().items()}


def side_values(agg: Any, grades: Sequence[Mapping[str, Any]], baseline_side: bool) -> dict[str, Mapping[str, float]]:
    """One side of a grader's margin pairs (margin -> case#repeat -> value), packed. Each key is one
    row here, and a built-in's value for a key reads that key's grades alone, so its values are
    taken a chunk of grades at a time and packed as they come (a plugin's at once)."""
    ours = getattr(agg.margin_values, "__func__", agg.margin_values).__module__.startswith("evalkit.")
    step = SEQ_CHUNK if ours else max(len(grades), 1)
    packers: dict[str, _Packer] = {}
    for i in range(0, max(len(grades), 1), step):
        for m, d in aggregate_hook(agg, "margin_values", grades[i:i + step], baseline_side).items():
            packers.setdefault(m, _Packer()).add(d)
    return {m: p.result() for m, p in packers.items()}


class PairValues(Mapping[str, float]):
    """One side's values keyed ``case#repeat``, packed per case as sorted repeats and their values
    (12 bytes a pair; as a dict, with its key strings and floats, ~140): a report read a level at a
    time holds the concurrency-1 side of every pair until the top level is read. Reads as the dict."""

    def __init__(self, cases: dict[str, tuple[np.ndarray, np.ndarray]], n: int) -> None:
        self.cases, self._n = cases, n

    def __getitem__(self, key: str) -> float:
        case, _, rep = key.rpartition("#")
        hit = self.cases.get(case)
        if hit is None or not (rep.isascii() and rep.isdigit()) or str(int(rep)) != rep:  # "a#00" is not "a#0"
            raise KeyError(key)
        reps, vals = hit
        i = int(np.searchsorted(reps, int(rep)))
        if i == reps.size or reps[i] != int(rep):
            raise KeyError(key)
        return float(vals[i])

    def __iter__(self) -> Iterator[str]:
        for case, (reps, _) in self.cases.items():
            for rep in reps.tolist():
                yield f"{case}#{rep}"

    def __len__(self) -> int:
        return self._n


def _pack(d: dict[str, Any]) -> Mapping[str, Any]:
    """``d`` as `PairValues` when every key is ``case#repeat`` and every value a float (what a
    plugin returns otherwise is kept as it is)."""
    p = _Packer()
    p.add(d)
    return d if p.plain is not None else p.result()


def _split(d: dict[str, Any]) -> dict[str, tuple[list[int], list[float]]] | None:
    """case -> (its repeats, their values) of ``d``'s ``case#repeat`` keys; None when a key or value is not that."""
    by: dict[str, tuple[list[int], list[float]]] = {}
    for k, v in d.items():
        case, sep, rep = k.rpartition("#") if isinstance(k, str) else ("", "", "")
        if not sep or type(v) is not float or not (rep.isascii() and rep.isdigit()) or str(int(rep)) != rep:
            return None
        reps, vals = by.setdefault(case, ([], []))
        reps.append(int(rep))
        vals.append(v)
    return by


class _Packer:
    """One margin's side packed as its values come, a dict of them at a time (`PairValues`); kept
    as a plain dict once one of them cannot be packed."""

    def __init__(self) -> None:
        self.cases: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.n = 0
        self.plain: dict[str, Any] | None = None

    def add(self, d: dict[str, Any]) -> None:
        if self.plain is None:
            by = _split(d)
            if by is not None:
                for case, (reps, vals) in by.items():
                    self.cases.setdefault(case, []).append((np.asarray(reps, dtype=np.int64),
                                                            np.asarray(vals, dtype=np.float64)))
                self.n += len(d)
                return
            self.plain = dict(self.result())
        self.plain.update(d)

    def result(self) -> Mapping[str, Any]:
        if self.plain is not None:
            return self.plain
        cases = {}
        for case, parts in self.cases.items():
            reps, vals = (np.concatenate([p[j] for p in parts]) for j in (0, 1))
            order = np.argsort(reps, kind="stable")
            cases[case] = (reps[order], vals[order])
        return PairValues(cases, self.n)


def load_entry(v: str, top: int, load: list[dict[str, Any]], seq: dict[str, dict[str, Mapping[str, float]]]
               ) -> dict[str, Any]:
    """One variant's entry: its successful rows at the top level ``load`` against ``seq`` (`seq_values`)."""
    lg = [r["grades"]["load_drift"] for r in load if "load_drift" in r["grades"]]
    entry: dict[str, Any] = {"variant": v, "level": top, "pairs": len(lg),  # the deltas' own count when more
                             "identical_pct": 100.0 * sum(bool(g["passed"]) for g in lg) / len(lg) if lg else None,
                             "drift_mean": mean([g["detail"]["drift"] for g in lg]), "deltas": {}}
    for name, agg in _margin_graders().items():
        mine = side_values(agg, _grades(load, name), False)  # packed as it comes, as the other side was
        base = seq.get(name, {})
        for m, side in mine.items():  # a margin at a time: one list of differences held
            diffs = sorted_differences(side, base.get(m, {}))
            if diffs is None:
                diffs = paired_differences(agg, [], base_values={m: base.get(m, {})}, values={m: side})[m]
            if len(diffs):
                ci = bootstrap_ci(diffs)  # type: ignore[arg-type]
                entry["deltas"][m] = {"delta": mean(diffs), "ci95": list(ci) if ci else None,  # type: ignore[arg-type]
                                      "pairs": len(diffs)}
    entry["pairs"] = max([entry["pairs"], *(x["pairs"] for x in entry["deltas"].values())])
    return entry


def sorted_differences(mine: Mapping[str, float], theirs: Mapping[str, float]) -> np.ndarray | None:
    """`paired_differences`' list for one margin (candidate minus baseline over the keys both
    have, in the keys' sorted order) from two packed sides, without a key string a pair; None
    when a side is not packed or a case id holds "#" (then the keys' order is not the cases'
    order and then the repeats' as text, which this follows)."""
    if not (isinstance(mine, PairValues) and isinstance(theirs, PairValues)):
        return None
    cases = [c for c in mine.cases if c in theirs.cases]
    if any("#" in c for c in cases):
        return None
    out = []
    for c in sorted(cases, key=lambda c: c + "#"):
        (ra, va), (rb, vb) = mine.cases[c], theirs.cases[c]
        common, ia, ib = np.intersect1d(ra, rb, assume_unique=True, return_indices=True)
        order = np.argsort(common.astype(str), kind="stable")  # "case#10" sorts before "case#9"
        out.append(va[ia[order]] - vb[ib[order]])
    return np.concatenate(out) if out else np.empty(0)


def lines(entries: list[dict[str, Any]]) -> list[str]:
    """One line per variant; no interval, and no difference, from zero pairs: "no pairs" instead."""
    out = []
    for e in entries:
        d = "; ".join(_delta_text(m, x, e["pairs"]) for m, x in e["deltas"].items())
        ident = "-" if e["identical_pct"] is None else f"{e['identical_pct']:.0f} %"
        drift = "-" if e["drift_mean"] is None else round(e["drift_mean"], 3)
        head = f"{ident} byte-identical, drift {drift}" if e["pairs"] else "no pairs"
        out.append(f"quality under load {e['variant']}: concurrency {e['level']} vs 1 over {e['pairs']} pairs: {head}"
                   + (f"; {d}" if d else ""))
    return out


def _delta_text(m: str, x: dict[str, Any], pairs: int) -> str:
    """`schema_pass +0 [+0, +0]`, with its own pairs when they are not the line's; never an interval from none."""
    n = x.get("pairs", pairs)
    if not n:
        return f"{m} no pairs"
    ci = f" [{x['ci95'][0]:+.3g}, {x['ci95'][1]:+.3g}]" if x["ci95"] else ""
    return f"{m} {x['delta']:+.3g}{ci}" + (f" over {n} pairs" if n != pairs else "")
