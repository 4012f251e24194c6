"""Semantic drift between each candidate variant and the baseline on the same case, next to the
baseline's own noise floor.

Like is compared with like. The reference is the baseline's first noise-floor pass: a pass sent
after the run's R repeats, under a sampling seed no candidate uses (seed + R). The noise-floor
pairs are the baseline's repeats 0..R-1 against that reference; the drift pairs are each
candidate's repeats 0..R-1 against it. Both pairs then differ by one seed; the only other
difference is which model wrote the first output. (Comparing a candidate with a baseline output of
the *same* seed would share the sampler's random stream and understate drift against a floor that
does not.) Without a floor pass (`baseline_repeats: 1`) the reference is the baseline's repeat 0,
the floor its other repeats against it, and a candidate's repeat 0, sent under the reference's own
seed, is compared with the baseline's repeat 1 instead, so every pair is still a seed apart; with
one baseline pass there is no other seed, and the pair's detail says ``same_seed``.

Each pair stores cosine similarity of sentence embeddings, ROUGE-L F1 (lexical), and for JSON
outputs a field-by-field comparison. Drift means 1 - cosine; the report compares drift with the
floor case by case and bootstraps the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..catalogue import CaseValue, Metric
from ..stats import SignFlipMean, mean, min_detectable, verdict
from .base import Aggregate, CannedQuery, GradedRequest, Grader, GraderContext, Margin, Score, Threshold
from .text import json_fields, prose


def lcs_len(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(a: str, b: str) -> float:
    """ROUGE-L F1 on lower-cased word tokens."""
    ta, tb = a.lower().split(), b.lower().split()
    if not ta or not tb:
        return 1.0 if ta == tb else 0.0
    lcs = lcs_len(ta, tb)
    if lcs == 0:
        return 0.0
    p, r = lcs / len(ta), lcs / len(tb)
    return 2 * p * r / (p + r)


def field_diff(a: str, b: str) -> dict[str, Any] | None:
    fa, fb = json_fields(a), json_fields(b)
    if fa is None or fb is None:
        return None
    keys = sorted(set(fa) | set(fb))
    return {
        "same_keys": set(fa) == set(fb),
        "fields": {k: {"equal": fa.get(k) == fb.get(k),
                       "rouge_l": round(rouge_l(fa.get(k, ""), fb.get(k, "")), 4)} for k in keys},
    }


class DriftAggregate(Aggregate):
    columns = (
        Metric("drift_mean", "drift", 3, "mean 1 - cosine vs the baseline's output", "1-cos"),
        Metric("floor_mean", "noise floor", 3, "mean 1 - cosine between two baseline passes (other seed)", "1-cos"),
        Metric("drift_minus_floor", "drift − floor", 3, "drift minus the noise floor, paired by case", "1-cos",
               signed=True),
        Metric("drift_minus_floor_ci95", "95% CI", 3, "95 % interval of drift − floor (its sign-flip test)", "1-cos"),
        Metric("drift_verdict", "verdict", None, "a verdict only where the interval excludes 0"),
    )
    headline = ("drift_minus_floor",)
    thresholds = (Threshold("drift_above_floor", "drift_minus_floor", "max", "fail a variant whose drift − noise floor "
                            "lies above this (its whole 95 % interval)", ci_key="drift_minus_floor_ci95",
                            candidates_only=True),)
    margins = (Margin("drift", "abs", False, "drift (1 − cosine vs the baseline) minus the baseline's own noise floor, "
                      "per case"),)
    view_columns = (("drift_cosine", "value"),)
    canned_queries = (CannedQuery("worst_drift", "Largest drift from the baseline", "lowest", "drift_cosine"),)

    @classmethod
    def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        """A candidate's drift per case, set against the baseline's own noise floor per case."""
        return {"drift": _per_case(grades, "noise_floor" if baseline_side else "drift")}

    @classmethod
    def case_values(cls, baseline_side: bool) -> dict[str, CaseValue]:
        return {"drift": CaseValue("detail.drift", where=(("kind", "noise_floor" if baseline_side else "drift"),))}

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Drift next to the baseline's own noise floor, paired by case, with the 95 % interval of
        its sign-flip test (the p-value the report's Holm family takes is the same test's). For the
        baseline's own slice (``base_grades`` None) only the floor."""
        if base_grades is None:
            return _summary({}, _per_case(grades, "noise_floor"))
        return _summary(_per_case(grades, "drift"), _per_case(base_grades, "noise_floor"))

    @classmethod
    def summary_from_cases(cls, mine: dict[str, dict[str, float]] | None, base: dict[str, dict[str, float]]
                           ) -> dict[str, Any]:
        """`summarise` from the per-case drift and floor the ledger computes (`case_values`)."""
        return _summary({} if mine is None else mine.get("drift", {}), base.get("drift", {}))


def _summary(drift: dict[str, float], floor: dict[str, float]) -> dict[str, Any]:
    """Drift's summary of one slice from case -> drift and case -> the baseline's noise floor."""
    paired = sorted(set(drift) & set(floor))
    diffs = [drift[c] - floor[c] for c in paired]
    t = SignFlipMean(diffs)
    ci = t.interval(0.05, (0.0,)) if t.n >= 2 else None
    mdd = min_detectable(diffs)
    v = verdict(ci, "drift above the noise floor", "drift below the noise floor", "within the noise floor") \
        if drift else None
    if floor and not any(floor.values()):
        # every baseline pass was the same text: greedy decoding, or a deterministic server
        v = ("no noise floor (the baseline's passes were identical, as at temperature 0): any change counts; "
             "the divergence grader measures token-level difference") if drift else None
    elif v == "within the noise floor" and mdd is not None:
        v += f" (could detect ≥ {mdd:.3f} here)"  # a "no difference" says what difference it could see
    return {
        "drift_p": t.p(0.0) if drift and t.n >= 2 else None,  # two-sided, for the report's Holm family
        "drift_mean": mean(list(drift.values())), "floor_mean": mean(list(floor.values())),
        "drift_minus_floor": mean(diffs), "drift_minus_floor_ci95": list(ci) if ci else None,
        "drift_pairs": len(paired), "drift_min_detectable": mdd if drift else None,
        "drift_verdict": v,
    }


class DriftGrader(Grader):
    """Per-pair grader: needs the baseline's outputs for the same cases, so it grades a run at once."""

    name = "drift"
    version = "4"  # 4: no floor pass: repeat 0 against the baseline's repeat 1 (3: the floor pass is the reference)
    kind = "pair"
    description = "1 - cosine of MiniLM embeddings vs the baseline's output, next to the baseline's own noise floor"
    aggregate = DriftAggregate

    def __init__(self, embed: Callable[[list[str]], Any]) -> None:
        self.embed = embed

    @classmethod
    def from_context(cls, ctx: GraderContext) -> DriftGrader:
        assert ctx.embed is not None
        return cls(ctx.embed)

    def grade_outputs(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str | None) -> dict[int, Score]:
        if baseline is None:
            return {}
        # like with like: a candidate is compared with the baseline at the same load level (level)
        base = {(i.level, i.case.id, repeats[i.request_id]): i for i in items if i.variant == baseline}
        # the run's repeats per case: what the candidates sent (a baseline-only run: one)
        n_rep: dict[tuple[str, str], int] = {}
        for i in items:
            if i.variant != baseline:
                k = (i.level, i.case.id)
                n_rep[k] = max(n_rep.get(k, 1), repeats[i.request_id] + 1)
        refs = {}
        for ph, case, _ in base:
            r = n_rep.get((ph, case), 1)
            refs[(ph, case)] = (base.get((ph, case, r)) or base.get((ph, case, 0)), r)
        pairs: list[tuple[GradedRequest, GradedRequest, str]] = []
        out: dict[int, Score] = {}
        for i in items:
            ref, r = refs.get((i.level, i.case.id), (None, 1))
            if ref is None:
                continue
            if i is ref:
                out[i.request_id] = Score(1.0, None, f"reference output for drift on {i.case.id}",
                                          {"kind": "reference"})
            elif i.variant != baseline:
                pairs.append((i, _a_seed_apart(i, ref, base, repeats), "drift"))
            elif repeats[i.request_id] < r:  # a measured repeat of the baseline against the floor pass
                pairs.append((i, ref, "noise_floor"))
        if not pairs:
            return out
        texts = [prose(t.text) for p in pairs for t in p[:2]]
        vecs = self.embed(texts)
        for k, (i, ref, kind) in enumerate(pairs):
            cos = float((vecs[2 * k] * vecs[2 * k + 1]).sum())
            rl = rouge_l(prose(i.text), prose(ref.text))
            what = "baseline repeat vs reference (noise floor)" if kind == "noise_floor" else f"vs {baseline}"
            same = repeats[i.request_id] == repeats[ref.request_id]
            out[i.request_id] = Score(
                cos, None, f"cosine {cos:.3f}, ROUGE-L {rl:.2f} {what}"
                + (" (same sampling seed: at temperature > 0 this understates drift)" if same else ""),
                {"kind": kind, "against_request_id": ref.request_id, "cosine": round(cos, 6),
                 "drift": round(1 - cos, 6), "rouge_l": round(rl, 6), "json": field_diff(i.text, ref.text),
                 **({"same_seed": True} if same else {})},
            )
        return out


def _a_seed_apart(i: GradedRequest, ref: GradedRequest, base: dict[tuple[str, str, int], GradedRequest],
                  repeats: dict[int, int]) -> GradedRequest:
    """The baseline output a candidate's repeat is compared with: the reference, unless the
    reference was sent under this repeat's own seed (no floor pass: it is the baseline's repeat 0);
    then the baseline's next repeat, one seed apart like every other pair (the reference when
    there is none)."""
    j = repeats[i.request_id]
    if repeats[ref.request_id] != j:
        return ref
    return base.get((i.level, i.case.id, j + 1), ref)


def _per_case(grades: list[dict[str, Any]], kind: str) -> dict[str, float]:
    """case -> mean drift (1 - cosine) of that kind of pair."""
    acc: dict[str, list[float]] = {}
    for g in grades:
        d = g["detail"]
        if d.get("kind") == kind:
            acc.setdefault(g["case_id"], []).append(d["drift"])
    return {k: sum(v) / len(v) for k, v in acc.items()}
