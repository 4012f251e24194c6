"""Quality under load: does batching or preemption change what a variant writes? Each case's
output at the highest concurrency the variant reached is compared with its own output at
concurrency 1 (same variant, same case and repeat, greedy decoding, so without load the two
would be the same text): byte-identical or not, and 1 − cosine of their embeddings. Runs only
when the matrix asks for it (`generation.quality_under_load`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..catalogue import Metric
from ..stats import bootstrap_ci, mean, wilson
from .base import Aggregate, CannedQuery, GradedRequest, Grader, GraderContext, Score, Threshold, pass_pct
from .text import prose


class LoadDriftAggregate(Aggregate):
    view_columns = (("load_cosine", "value"), ("load_identical", "passed"))
    columns = (
        Metric("load_level", "load level", None, "the concurrency compared with concurrency 1"),
        Metric("load_identical_pct", "identical under load %", 0, "outputs byte-identical to the sequential ones"),
        Metric("load_drift_mean", "drift under load", 3, "mean 1 - cosine vs the same case at concurrency 1"),
        Metric("load_drift_ci95", "95% CI", 3, "bootstrap 95% interval of that mean"),
        Metric("load_drift_verdict", "under load", None, "changed answers only where the data shows it"),
    )
    headline = ("load_identical_pct",)
    thresholds = (Threshold("load_identical", "load_identical_pct", "min", "minimum share of outputs unchanged under "
                            "load, 0-1", scale=100.0),)
    canned_queries = (CannedQuery("changed_under_load", "Outputs that changed under load (vs concurrency 1)",
                                  "failures"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        if not grades:
            return {}
        drift = [g["detail"]["drift"] for g in grades]
        ci = bootstrap_ci(drift)
        n_changed = sum(not g["passed"] for g in grades)
        # at greedy decoding any change is load's doing: what the data can say is how often it happens
        share = wilson(n_changed, len(grades))
        verdict = (f"{n_changed} of {len(grades)} answers changed under load" if n_changed else
                   f"all {len(grades)} answers unchanged under load")
        if share is not None:
            verdict += f" (changed share 95 % interval [{100 * share[0]:.0f}, {100 * share[1]:.0f}] %)"
        return {"load_level": max(g["detail"]["level"] for g in grades), "load_identical_pct": pass_pct(grades),
                "load_drift_mean": mean(drift), "load_drift_ci95": list(ci) if ci else None,
                "load_drift_verdict": verdict, "load_pairs": len(grades)}


class LoadDriftGrader(Grader):
    name = "load_drift"
    version = "1"
    kind = "pair"
    description = ("each case's output at the highest load level reached vs its own output at concurrency 1 "
                   "(greedy): byte-identical, and 1 - cosine")
    aggregate = LoadDriftAggregate

    def __init__(self, embed: Callable[[list[str]], Any] | None, enabled: bool) -> None:
        self.embed, self.enabled = embed, enabled

    @classmethod
    def from_context(cls, ctx: GraderContext) -> LoadDriftGrader:
        return cls(ctx.embed, ctx.quality_under_load)

    def grade_outputs(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str | None) -> dict[int, Score]:
        if not self.enabled:
            return {}
        pairs: list[tuple[GradedRequest, GradedRequest]] = []
        for v in dict.fromkeys(i.variant for i in items):
            mine = [i for i in items if i.variant == v]
            top = max(i.concurrency for i in mine)
            if top <= 1:
                continue
            seq = {(i.case.id, i.repeat): i for i in mine if i.concurrency == 1}
            pairs += [(i, seq[(i.case.id, i.repeat)]) for i in mine
                      if i.concurrency == top and (i.case.id, i.repeat) in seq]
        if not pairs:
            return {}
        vecs = self.embed([prose(t.text) for p in pairs for t in p]) if self.embed else None
        out = {}
        for k, (i, ref) in enumerate(pairs):
            same = i.text == ref.text
            cos = 1.0 if same or vecs is None else float((vecs[2 * k] * vecs[2 * k + 1]).sum())
            out[i.request_id] = Score(cos, same, ("identical to" if same else f"cosine {cos:.3f} vs")
                                      + f" its output at concurrency 1 (request {ref.request_id})",
                                      {"level": i.concurrency, "identical": same, "drift": round(1 - cos, 6),
                                       "against_request_id": ref.request_id})
        return out

