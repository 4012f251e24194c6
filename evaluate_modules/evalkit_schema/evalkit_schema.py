"""evalkit's JSON Schema adherence as an `evaluate` metric: references name schemas in rubrics/schemas.

    evaluate.load("metrics/evalkit_schema").compute(predictions=['{"subject": ...}'], references=["outreach_email"])
"""

import json

import datasets
import evaluate
from jsonschema import Draft202012Validator

from evalkit.output_schemas import load_schema


class EvalkitSchema(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Share of outputs that parse as JSON and validate against the named schema.",
            citation="", inputs_description="predictions: output texts; references: schema names.",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        ok = []
        for text, name in zip(predictions, references, strict=True):
            try:
                obj = json.loads(text)
            except ValueError:
                ok.append(False)
                continue
            ok.append(not any(Draft202012Validator(load_schema(name)).iter_errors(obj)))
        return {"schema_pass_rate": sum(ok) / (len(ok) or 1), "passed": ok}
