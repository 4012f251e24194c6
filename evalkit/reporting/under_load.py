"""Quality under load, per variant: the highest load level against concurrency 1, case by case
(same variant, same case and repeat): how many answers stayed byte-identical and how far the
others drifted (the `load_drift` grader), and what that did to every grader that offers a margin
(schema, persona, formality, plugins): the paired difference with a 95 % interval."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..grading import paired_differences
from ..grading.registry import available
from ..stats import bootstrap_ci, mean
from .grade_views import grade_views


def quality_under_load(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v and r["error_class"] is None]
        top = max((r["concurrency"] or 1 for r in mine), default=1)
        seq = [r for r in mine if (r["concurrency"] or 1) == 1]
        load = [r for r in mine if (r["concurrency"] or 1) == top]
        if top <= 1 or not seq or not load:
            continue
        out.append(load_entry(v, top, load, seq_values(seq)))
    return out


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
    value): all `load_entry` needs of those rows, so a report read a level at a time lets them go.
    Each key is one row here, and a built-in's value for a key reads that key's grades alone, so
    its values are taken a chunk of grades at a time and packed as they come (a plugin's at once)."""
    out: dict[str, dict[str, Mapping[str, float]]] = {}
    for name, agg in _margin_graders().items():
        grades = _grades(seq, name)
        ours = getattr(agg.margin_values, "__func__", agg.margin_values).__module__.startswith("evalkit.")
        step = SEQ_CHUNK if ours else max(len(grades), 1)
        packers: dict[str, _Packer] = {}
        for i in range(0, max(len(grades), 1), step):
            for m, d in agg.margin_values(grades[i:i + step], True).items():
                packers.setdefault(m, _Packer()).add(d)
        out[name] = {m: p.result() for m, p in packers.items()}
    return out


class PairValues(Mapping[str, float]):
    """One side's values keyed ``case#repeat``, packed per case as sorted repeats and their values
    (12 bytes a pair; as a dict, with its key strings and floats, ~140): a report read a level at a
    time holds the concurrency-1 side of every pair until the top level is read. Reads as the dict."""

    def __init__(self, cases: dict[str, tuple[np.ndarray, np.ndarray]], n: int) -> None:
        self._cases, self._n = cases, n

    def __getitem__(self, key: str) -> float:
        case, _, rep = key.rpartition("#")
        hit = self._cases.get(case)
        if hit is None or not (rep.isascii() and rep.isdigit()) or str(int(rep)) != rep:  # "a#00" is not "a#0"
            raise KeyError(key)
        reps, vals = hit
        i = int(np.searchsorted(reps, int(rep)))
        if i == reps.size or reps[i] != int(rep):
            raise KeyError(key)
        return float(vals[i])

    def __iter__(self) -> Iterator[str]:
        for case, (reps, _) in self._cases.items():
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
    entry: dict[str, Any] = {"variant": v, "level": top, "pairs": len(lg),
                             "identical_pct": 100.0 * sum(bool(g["passed"]) for g in lg) / len(lg) if lg else None,
                             "drift_mean": mean([g["detail"]["drift"] for g in lg]), "deltas": {}}
    for name, agg in _margin_graders().items():
        for m, diffs in paired_differences(agg, _grades(load, name), base_values=seq.get(name, {})).items():
            if diffs:
                ci = bootstrap_ci(diffs)
                entry["deltas"][m] = {"delta": mean(diffs), "ci95": list(ci) if ci else None, "pairs": len(diffs)}
    return entry


def lines(entries: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in entries:
        d = "; ".join(f"{m} {x['delta']:+.3g}" + (f" [{x['ci95'][0]:+.3g}, {x['ci95'][1]:+.3g}]" if x["ci95"] else "")
                      for m, x in e["deltas"].items())
        ident = "-" if e["identical_pct"] is None else f"{e['identical_pct']:.0f} %"
        out.append(f"quality under load {e['variant']}: concurrency {e['level']} vs 1 over {e['pairs']} pairs: "
                   f"{ident} byte-identical, drift {e['drift_mean'] if e['drift_mean'] is None else round(e['drift_mean'], 3)}"
                   + (f"; {d}" if d else ""))
    return out
