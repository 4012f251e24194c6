"""Token-level divergence under teacher forcing (issue 26; docs/measuring.md, "Token-level
divergence"): the baseline's answer to each case was scored on every variant's server with the
case's messages as context (`token_scores`, written by the runner while the servers were up). A
candidate's grade compares its server's next-token distributions with the baseline's at every
answer token: mean and p90/p99 KL, top-1 agreement, the change in the answer's log-likelihood (a
perplexity ratio), where the top tokens first differ. The baseline's own grade is its floor: the
same answers scored again in another batch (what vLLM's batching alone changes).

At temperature 0 it also says which answers are byte-identical to the baseline's and at which
token they first differ, and gives drift a floor (greedy drift): 1 − cosine of the candidate's
answer against the baseline's, next to the baseline's answer against its own regeneration in
another batch. Tokenizers that cut the answer differently are refused, never compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

from ..catalogue import CaseValue, Metric
from ..stats import mean, min_detectable, percentile, robust_mean, verdict
from .base import Aggregate, CannedQuery, GradedRequest, Grader, GraderContext, Margin, Score, Threshold
from .text import prose
from .token_kl import APPROXIMATION, compare, first_diff_token, mismatch

KINDS = ("reference", "floor", "candidate", "regen")

MIN_PAIRS = 48  # the fewest pairs a token-level margin is decided from (its shape; docs/verdicts.md)


class DivergenceAggregate(Aggregate):
    columns = (
        Metric("kl_mean", "KL", 4, "mean per-token D_KL(baseline ‖ variant), teacher-forced on the baseline's answer",
               "nats"),
        Metric("kl_floor", "KL floor", 4, "the same between the baseline and itself in another batch", "nats"),
        Metric("kl_minus_floor_ci95", "KL − floor 95% CI", 4, "interval of KL − floor, paired by case (sign-flip "
               "and studentized bootstrap, both must reject: valid on a zero-inflated floor)", "nats"),
        Metric("kl_p99", "KL p99", 3, "99th percentile of the per-token KL over every answer token", "nats"),
        Metric("top1_pct", "top-1 %", 1, "answer tokens where both servers' most likely next token is the same", "%"),
        Metric("ppl_ratio", "PPL ratio", 4, "perplexity of the baseline's answer on this server / on the baseline's"),
        Metric("greedy_identical_pct", "identical %", 0, "temperature 0: answers byte-identical to the baseline's",
               "%"),
        Metric("kl_verdict", "divergence", None, "above the batching floor only where the interval excludes 0"),
    )
    headline = ("kl_mean", "top1_pct")
    thresholds = (
        Threshold("kl_above_floor", "kl_minus_floor", "max", "fail a variant whose KL − batching floor lies above this "
                  "(its whole 95 % interval), nats per token", ci_key="kl_minus_floor_ci95", candidates_only=True),
        Threshold("top1_agreement", "top1_pct", "min", "minimum share of answer tokens whose top token agrees with the "
                  "baseline's, 0-1", scale=100.0, candidates_only=True),
    )
    # per-case KL against a floor that is 0 on most cases is strongly skewed: at fewer pairs the
    # tests read up to 8 % wrong where 5 % is promised (docs/verdicts.md, the shapes table)
    margins = (
        Margin("kl", "abs", False, "teacher-forced KL per token against the baseline, minus the baseline's batching "
               "floor, per case (nats)", min_pairs=MIN_PAIRS, one_sided=True),
        Margin("top1_agreement", "abs", True, "top-1 agreement with the baseline minus the floor's, per case "
               "(percentage points of answer tokens)", min_pairs=MIN_PAIRS, one_sided=True),
        Margin("greedy_drift", "abs", False, "temperature 0: drift (1 − cosine) against the baseline's answer minus "
               "the baseline against its regeneration in another batch, per case", min_pairs=MIN_PAIRS,
               one_sided=True),
    )
    view_columns = (("kl_mean", "value"),)
    notes_where = ("status",)  # every note reads a scored or refused grade
    canned_queries = (CannedQuery("worst_divergence", "Answers whose next-token distributions diverge most from the "
                                  "baseline's (teacher-forced KL)", "highest", "kl_mean"),)

    @classmethod
    def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        kind = "floor" if baseline_side else "candidate"
        return {"kl": _per_case(grades, kind, "kl_mean"), "top1_agreement": _per_case(grades, kind, "top1_pct"),
                "greedy_drift": _per_case(grades, kind, "greedy_drift")}

    @classmethod
    def case_values(cls, baseline_side: bool) -> dict[str, CaseValue]:
        where = (("kind", "floor" if baseline_side else "candidate"), ("status", "ok"))
        return {m: CaseValue(f"detail.{key}", where=where)
                for m, key in (("kl", "kl_mean"), ("top1_agreement", "top1_pct"), ("greedy_drift", "greedy_drift"))}

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        """A candidate's KL and top-1 agreement next to the baseline's batching floor, paired by
        case, with intervals of the shape-robust test (`stats.robust`); the two-sided p at 0 of
        KL − floor (``kl_p``) joins the variant's Holm family in the report (`verdicts.apply_holm`),
        which rewrites a flag that does not survive. For the baseline's own slice only the floor."""
        mine = [g for g in grades if (g.get("detail") or {}).get("status") == "ok"]
        if not grades:
            return {}
        if not mine:
            return {"kl_verdict": "not scored (the report's notes say why)", "not_scored": len(grades)}
        if base_grades is None:
            kl, top1 = _per_case(mine, "floor", "kl_mean"), _per_case(mine, "floor", "top1_pct")
            same = [g["detail"]["identical"] for g in mine if g["detail"].get("identical") is not None]
            return {"kl_mean": None, "kl_floor": mean(list(kl.values())),
                    "top1_pct": mean(list(top1.values())), "kl_p99": _pooled_p99(mine),
                    "ppl_ratio": _ppl(mine), "greedy_identical_pct": 100.0 * sum(same) / len(same) if same else None,
                    "kl_pairs": len(kl)}
        out: dict[str, Any] = {}
        for name, key in (("kl", "kl_mean"), ("top1", "top1_pct"), ("greedy_drift", "greedy_drift")):
            a, b = _per_case(mine, "candidate", key), _per_case(base_grades, "floor", key)
            diffs = [a[c] - b[c] for c in sorted(set(a) & set(b))]
            t = robust_mean(diffs)  # per-case KL is skewed and the floor often zero: a shape-robust test
            ci = t.interval(0.05, (0.0,)) if t.n >= 2 else None
            out.update({f"{name}_mean": mean(list(a.values())), f"{name}_floor": mean(list(b.values())),
                        f"{name}_minus_floor": mean(diffs), f"{name}_minus_floor_ci95": list(ci) if ci else None,
                        f"{name}_pairs": t.n, f"{name}_min_detectable": min_detectable(diffs),
                        f"{name}_p": t.p(0.0) if t.n >= 2 else None})
        out["top1_pct"] = out.pop("top1_mean")
        v = verdict(out["kl_minus_floor_ci95"] and tuple(out["kl_minus_floor_ci95"]), "above the batching floor",
                    "below the batching floor", "within the batching floor") if out["kl_pairs"] else None
        if v == "within the batching floor" and out["kl_min_detectable"] is not None:
            v += f" (could detect ≥ {out['kl_min_detectable']:.2g} here)"
        same = [g["detail"]["identical"] for g in mine if g["detail"].get("identical") is not None]
        firsts = [g["detail"]["first_diff_token"] for g in mine if g["detail"].get("first_diff_token") is not None]
        out.update({"kl_verdict": v, "kl_p99": _pooled_p99(mine), "ppl_ratio": _ppl(mine),
                    "kl_tail_mean": mean([g["detail"].get("tail_mean") for g in mine]),
                    "greedy_identical_pct": 100.0 * sum(same) / len(same) if same else None,
                    "greedy_first_diff_median": percentile(firsts, 50),
                    "first_top1_diff_median": percentile([g["detail"]["first_top1_diff"] for g in mine
                                                          if g["detail"].get("first_top1_diff") is not None], 50),
                    "not_scored": len(grades) - len(mine)})
        return out

    @classmethod
    def notes(cls, rows: list[dict[str, Any]]) -> list[str]:
        """Why a variant has no divergence (a server that does not score given text, another
        tokenizer), once per variant and reason."""
        seen: dict[tuple[str, str], int] = {}
        for r in rows:
            d = (r.get("grades", {}).get("divergence") or {}).get("detail") or {}
            if d.get("status") not in (None, "ok"):
                key = (r["variant"], d.get("reason") or d["status"])
                seen[key] = seen.get(key, 0) + 1
        out = [f"divergence: {v}: not scored for {n} case(s): {why}" for (v, why), n in seen.items()]
        ok = [d for r in rows if (d := ((r.get("grades", {}).get("divergence") or {}).get("detail") or {}))
              .get("status") == "ok" and d.get("tail_mean") is not None]
        if ok:
            out.append(f"divergence: KL is a lower bound over the top-{ok[0].get('top_k')} tokens both servers returned, "
                       f"the rest as one bucket; the baseline's probability outside them averaged "
                       f"{100 * (mean([d['tail_mean'] for d in ok]) or 0):.1f} % per token (at most "
                       f"{100 * max(d.get('tail_max') or 0 for d in ok):.0f} %): a larger divergence.top_k (with vLLM's "
                       "--max-logprobs) tightens it")
        return out


class DivergenceGrader(Grader):
    name = "divergence"
    version = "1"
    kind = "pair"
    description = ("teacher-forced next-token divergence from the baseline (KL, top-1 agreement, perplexity ratio) "
                   "next to the baseline's own batching floor; at temperature 0, identical answers and greedy drift")
    aggregate = DivergenceAggregate

    def __init__(self, ctx: GraderContext) -> None:
        self.context = ctx  # grade_run sets `token_scores` on it for the run being graded

    @classmethod
    def from_context(cls, ctx: GraderContext) -> DivergenceGrader:
        return cls(ctx)

    def grade_outputs(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str | None) -> dict[int, Score]:
        source = self.context.token_scores
        rows = source() if source is not None else []
        if baseline is None or not rows:
            return {}
        by_id = {i.request_id: i for i in items}
        latest: dict[tuple[str, str, str], dict[str, Any]] = {}
        failed: dict[tuple[str, str], dict[str, Any]] = {}
        unsupported: dict[str, dict[str, Any]] = {}  # variant -> the answer that said its server does not score
        for r in rows:  # in write order: the newest row of a kind wins (a resume may score again)
            if r["status"] == "unsupported":
                unsupported.setdefault(r["variant"], r)
            if r["kind"] not in KINDS:
                continue
            if r["status"] == "ok":
                latest[(r["variant"], r["case_id"], r["kind"])] = r
                failed.pop((r["variant"], r["case_id"]), None)
            elif (r["variant"], r["case_id"], r["kind"]) not in latest:
                failed[(r["variant"], r["case_id"])] = r
        firsts: dict[tuple[str, str], GradedRequest] = {}
        for i in sorted(items, key=lambda x: (x.concurrency, repeats.get(x.request_id, 0), x.request_id)):
            firsts.setdefault((i.variant, i.case.id), i)  # a variant's answer to a case: first level, first repeat
        pairs: list[tuple[GradedRequest, str, str]] = []  # (graded request, text, other text) for greedy drift
        out: dict[int, Score] = {}
        for (variant, case), item in firsts.items():
            ref = latest.get((baseline, case, "reference"))
            kind = "floor" if variant == baseline else "candidate"
            if variant == baseline:
                item = by_id.get(ref["answer_request_id"], item) if ref else item
            other = latest.get((variant, case, kind))
            if other is None:  # this server did not score the case: say why, if it tried
                bad = failed.get((variant, case)) or unsupported.get(variant)
                if bad is not None:
                    why = bad.get("error") or bad["status"]
                    if bad["status"] == "unsupported":
                        why = f"the server does not score given text (a hosted API?): {why}"
                    out[item.request_id] = _unscored(kind, bad["status"], why)
                continue
            if ref is None:
                bad = failed.get((baseline, case))
                out[item.request_id] = _unscored(kind, "no_reference", f"the baseline ({baseline}) did not score this "
                                                 "answer" + (f": {bad.get('error')}" if bad else ""))
                continue
            why = mismatch(ref["tokens"], other["tokens"])
            if why:
                out[item.request_id] = Score(cast(float, None), None, f"not compared: {why}",
                                             {"kind": kind, "status": "refused", "reason": why})
                continue
            c = compare(ref["tokens"], other["tokens"])
            s = c.summary()
            answer = by_id.get(ref["answer_request_id"])
            base_text = answer.text if answer is not None else ""
            greedy = ref.get("temperature") == 0
            own = item.text if variant != baseline else (latest.get((baseline, case, "regen")) or {}).get("text")
            d = {"kind": kind, "status": "ok", "against": baseline, "answer_request_id": ref["answer_request_id"],
                 "token_rows": [ref["id"], other["id"]], "top_k": other["top_k"], "approximation": APPROXIMATION,
                 **{k: (round(v, 8) if isinstance(v, float) else v) for k, v in s.items()},
                 "kl_tokens": [round(x, 6) for x in c.kl], "greedy": greedy}
            if s["first_top1_diff"] is not None:
                k = s["first_top1_diff"]
                d["first_top1_tokens"] = [ref["tokens"]["top1_text"][k], other["tokens"]["top1_text"][k]]
            if greedy and own is not None:
                d["identical"] = own == base_text
                d["first_diff_token"] = first_diff_token(base_text, own, ref["tokens"])
                pairs.append((item, base_text, own))
            where = "" if s["first_top1_diff"] is None else f"; top tokens first differ at token {s['first_top1_diff']}"
            what = "the baseline in another batch (floor)" if kind == "floor" else f"vs {baseline}"
            out[item.request_id] = Score(
                s["kl_mean"], None, f"KL {s['kl_mean']:.3g}/token (p99 {s['kl_p99']:.3g}), top-1 {s['top1_pct']:.1f} %, "
                f"PPL x{s['ppl_ratio']:.4f} over {s['n_tokens']} tokens {what}{where}", d)
        if pairs and self.context.embed is not None:
            self._greedy_drift(pairs, out, self.context.embed)
        return out

    @staticmethod
    def _greedy_drift(pairs: list[tuple[GradedRequest, str, str]], out: dict[int, Score],
                      embed: Callable[[list[str]], Any]) -> None:
        vecs = embed([prose(t) for _, a, b in pairs for t in (a, b)])
        for k, (item, _, _) in enumerate(pairs):
            cos = float((vecs[2 * k] * vecs[2 * k + 1]).sum())
            out[item.request_id].detail["greedy_drift"] = round(max(0.0, 1.0 - cos), 6)


def _unscored(kind: str, status: str, why: str) -> Score:
    return Score(cast(float, None), None, f"not scored: {why}", {"kind": kind, "status": status, "reason": why})


def _per_case(grades: list[dict[str, Any]], kind: str, key: str) -> dict[str, float]:
    """case -> the mean of one detail figure over its grades of one kind (each case has one)."""
    acc: dict[str, list[float]] = {}
    for g in grades:
        d = g.get("detail") or {}
        if d.get("kind") == kind and d.get("status") == "ok" and d.get(key) is not None:
            acc.setdefault(g["case_id"], []).append(float(d[key]))
    return {c: sum(v) / len(v) for c, v in acc.items()}


def _pooled_p99(grades: list[dict[str, Any]]) -> float | None:
    return percentile([x for g in grades for x in (g["detail"].get("kl_tokens") or [])], 99)


def _ppl(grades: list[dict[str, Any]]) -> float | None:
    """Token-weighted: exp(−Σ Δ log p / Σ tokens) over every answer token of the slice."""
    n = sum(g["detail"].get("n_tokens") or 0 for g in grades)
    if not n:
        return None
    return math.exp(-sum((g["detail"].get("dlogl_mean") or 0.0) * (g["detail"].get("n_tokens") or 0)
                         for g in grades) / n)
