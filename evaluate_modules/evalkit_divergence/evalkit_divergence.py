"""evalkit's divergence grader as an `evaluate` metric: token-level divergence between two
teacher-forced scorings of the same text (e.g. a quantized model's server against the baseline's),
computed by the grader's own comparison (evalkit.grading.token_kl), so the two never disagree.

Each prediction and reference is one scoring as JSON, in the ledger's `token_scores.tokens_json`
shape: per answer token `ids`, `text`, `lp` (the token's log-probability), `top_ids` and `top_lp`
(the server's top-k, in rank order). The reference is the baseline's (P), the prediction the
candidate's (Q): D_KL(P ‖ Q) over the top-k buckets plus one tail bucket, a lower bound of the
full KL (docs/measuring.md).

    evaluate.load("evaluate_modules/evalkit_divergence").compute(predictions=[...], references=[...])
"""

import json
import math

import datasets
import evaluate

from evalkit.grading.token_kl import compare, mismatch


class EvalkitDivergence(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Teacher-forced KL divergence, top-1 agreement and perplexity ratio between two scorings.",
            citation="", inputs_description="predictions and references: token scorings as JSON (token_scores shape).",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        per, refused = [], []
        for p, r in zip(predictions, references, strict=True):
            q, ref = json.loads(p), json.loads(r)
            why = mismatch(ref, q)
            if why:
                refused.append(why)
                per.append(None)
                continue
            per.append(compare(ref, q))
        ok = [c for c in per if c is not None]
        kl = [x for c in ok for x in c.kl]
        agree = [a for c in ok for a in c.top1_agree]
        dlp = [d for c in ok for d in c.dlp]
        n = len(kl) or 1
        return {"kl_mean": sum(kl) / n, "top1_agreement": sum(agree) / n, "ppl_ratio": math.exp(-sum(dlp) / n),
                "kl_per_pair": [None if c is None else c.summary()["kl_mean"] for c in per], "refused": refused}
