"""evalkit's formality grader as a Hugging Face `evaluate` metric (loads offline from this path).
It wraps the grader itself, so the two can never disagree.

    import evaluate
    m = evaluate.load("evaluate_modules/evalkit_formality")
    m.compute(predictions=["hey! wanna chat?"], references=[1])
"""

import datasets
import evaluate

from evalkit.grading import GradedRequest, make_graders
from evalkit.grading.base import bare_case

_DESCRIPTION = "Predicts the formality level (1-5) of each text with evalkit's formality grader and compares it to the label."
_KWARGS = "predictions: list of texts; references: list of integer levels 1-5."


class EvalkitFormality(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation="", inputs_description=_KWARGS,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references):
        (grader,) = make_graders(["formality"])
        items = [GradedRequest(i, "prediction", text, None, bare_case(f"c{i}", formality=level))
                 for i, (text, level) in enumerate(zip(predictions, references, strict=True))]
        scores = grader.grade_batch(items)
        levels = [int(s.value) for s in scores]
        errors = [s.detail["error"] for s in scores]
        n = len(levels) or 1
        return {
            "exact_accuracy": sum(e == 0 for e in errors) / n,
            "within_1_accuracy": sum(abs(e) <= 1 for e in errors) / n,
            "mae": sum(abs(e) for e in errors) / n,
            "predicted_levels": levels,
        }
