"""evalkit's JSON Schema grader as an `evaluate` metric: references name schemas in rubrics/schemas.
It wraps the grader itself, so the two can never disagree.

    evaluate.load("evaluate_modules/evalkit_schema").compute(predictions=['{"subject": ...}'], references=["outreach_email"])
"""

import datasets
import evaluate

from evalkit.grading import GradedRequest, make_graders
from evalkit.grading.base import bare_case


class EvalkitSchema(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Share of outputs that parse as JSON and validate against the named schema.",
            citation="", inputs_description="predictions: output texts; references: schema names.",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        (grader,) = make_graders(["schema"])
        items = [GradedRequest(i, "prediction", text, None, bare_case(f"c{i}", schema=name))
                 for i, (text, name) in enumerate(zip(predictions, references, strict=True))]
        ok = [bool(s.passed) for s in grader.grade_batch(items)]
        return {"schema_pass_rate": sum(ok) / (len(ok) or 1), "passed": ok}
