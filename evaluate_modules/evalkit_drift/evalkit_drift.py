"""evalkit's drift grader as an `evaluate` metric: cosine of all-MiniLM-L6-v2 embeddings and ROUGE-L
between each prediction and its reference (e.g. a quantized model's output vs the baseline's).
It wraps the grader itself (each pair is one case: the reference as the baseline's output).

    evaluate.load("evaluate_modules/evalkit_drift").compute(predictions=[...], references=[...])
"""

import datasets
import evaluate

from evalkit.grading import GradedRequest, make_graders
from evalkit.grading.base import bare_case


class EvalkitDrift(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Mean cosine similarity and ROUGE-L F1 between predictions and references.",
            citation="", inputs_description="predictions and references: texts (JSON outputs are flattened).",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        (grader,) = make_graders(["drift"])
        items, repeats = [], {}
        for k, (p, r) in enumerate(zip(predictions, references, strict=True)):
            case = bare_case(f"pair{k}")
            items += [GradedRequest(2 * k, "reference", r, None, case), GradedRequest(2 * k + 1, "prediction", p, None, case)]
            repeats[2 * k] = repeats[2 * k + 1] = 0
        scores = grader.grade_outputs(items, repeats, "reference")
        got = [scores[2 * k + 1] for k in range(len(predictions))]
        cos = [s.detail["cosine"] for s in got]
        rl = [s.detail["rouge_l"] for s in got]
        n = len(cos) or 1
        return {"cosine_mean": sum(cos) / n, "drift_mean": 1 - sum(cos) / n, "rouge_l_mean": sum(rl) / n,
                "cosine": cos}
