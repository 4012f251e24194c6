"""evalkit's formality scorer as a Hugging Face `evaluate` metric (loads offline from this path).

    import evaluate
    m = evaluate.load("metrics/evalkit_formality")
    m.compute(predictions=["hey! wanna chat?"], references=[1])
"""

import datasets
import evaluate

from evalkit.grading.formality import predict

_DESCRIPTION = "Predicts the formality level (1-5) of each text with evalkit's rubric and compares it to the label."
_KWARGS = "predictions: list of texts; references: list of integer levels 1-5."


class EvalkitFormality(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation="", inputs_description=_KWARGS,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references):
        levels = [predict(t)[0] for t in predictions]
        n = len(levels) or 1
        return {
            "exact_accuracy": sum(p == r for p, r in zip(levels, references, strict=True)) / n,
            "within_1_accuracy": sum(abs(p - r) <= 1 for p, r in zip(levels, references, strict=True)) / n,
            "mae": sum(abs(p - r) for p, r in zip(levels, references, strict=True)) / n,
            "predicted_levels": levels,
        }
