"""Semantic drift between each candidate variant and the baseline on the same case, next to the
baseline's own noise floor.

Like is compared with like. The reference is the baseline's output under a *different* seed from
the candidates' (repeat 1, when the baseline was sent twice). The noise-floor pair is the
baseline's repeat 0 vs that reference; the drift pair is a candidate's repeat 0 (the same seed as
the baseline's repeat 0) vs that reference. Both pairs then differ by one seed; the only other
difference is which model wrote the seed-0 output. (Comparing a candidate with the baseline under
the *same* seed would share the sampler's random stream and understate drift against a floor
that does not.) Without a second baseline repeat, the reference is repeat 0 and there is no floor.

Each pair stores cosine similarity of sentence embeddings, ROUGE-L F1 (lexical), and for JSON
outputs a field-by-field comparison. Drift means 1 - cosine; the report compares drift with the
floor case by case and bootstraps the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import GradedRequest, Score
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


class DriftGrader:
    """Run-level grader: needs every variant's outputs, so it grades a whole run at once."""

    name = "drift"
    version = "2"  # 2: the reference is the baseline under another seed (v1 used the same seed)

    def __init__(self, embed: Callable[[list[str]], Any]) -> None:
        self.embed = embed

    def grade_run(self, items: list[GradedRequest], repeats: dict[int, int], baseline: str) -> dict[int, Score]:
        base = {(i.case.id, repeats[i.request_id]): i for i in items if i.variant == baseline}
        refs = {case: base.get((case, 1)) or base[(case, 0)] for case, rep in base if rep in (0, 1)}
        pairs: list[tuple[GradedRequest, GradedRequest, str]] = []
        out: dict[int, Score] = {}
        for i in items:
            ref = refs.get(i.case.id)
            if ref is None:
                continue
            if i is ref:
                out[i.request_id] = Score(1.0, None, f"reference output for drift on {i.case.id}",
                                          {"kind": "reference"})
            else:
                pairs.append((i, ref, "noise_floor" if i.variant == baseline else "drift"))
        if not pairs:
            return out
        texts = [prose(t.text) for p in pairs for t in p[:2]]
        vecs = self.embed(texts)
        for k, (i, ref, kind) in enumerate(pairs):
            cos = float((vecs[2 * k] * vecs[2 * k + 1]).sum())
            rl = rouge_l(prose(i.text), prose(ref.text))
            what = "baseline repeat vs reference (noise floor)" if kind == "noise_floor" else f"vs {baseline}"
            out[i.request_id] = Score(
                cos, None, f"cosine {cos:.3f}, ROUGE-L {rl:.2f} {what}",
                {"kind": kind, "against_request_id": ref.request_id, "cosine": round(cos, 6),
                 "drift": round(1 - cos, 6), "rouge_l": round(rl, 6), "json": field_diff(i.text, ref.text)},
            )
        return out
