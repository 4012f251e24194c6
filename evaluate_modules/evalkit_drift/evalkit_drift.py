"""evalkit's semantic drift as an `evaluate` metric: cosine of all-MiniLM-L6-v2 embeddings and ROUGE-L
between each prediction and its reference (e.g. a quantized model's output vs the baseline's).

    evaluate.load("metrics/evalkit_drift").compute(predictions=[...], references=[...])
"""

import datasets
import evaluate

from evalkit.grading.drift import rouge_l
from evalkit.grading.embeddings import cosine, embed
from evalkit.grading.text import prose


class EvalkitDrift(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Mean cosine similarity and ROUGE-L F1 between predictions and references.",
            citation="", inputs_description="predictions and references: texts (JSON outputs are flattened).",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        p = [prose(x) for x in predictions]
        r = [prose(x) for x in references]
        vp, vr = embed(p), embed(r)
        cos = [cosine(a, b) for a, b in zip(vp, vr, strict=True)]
        rl = [rouge_l(a, b) for a, b in zip(p, r, strict=True)]
        n = len(cos) or 1
        return {"cosine_mean": sum(cos) / n, "drift_mean": 1 - sum(cos) / n, "rouge_l_mean": sum(rl) / n,
                "cosine": cos}
