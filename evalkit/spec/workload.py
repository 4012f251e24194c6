"""A workload folder of one's own, scaffolded by `evalkit init DIR`: cases, a schema, a matrix with
two endpoints and a grader stub, which run as they are against two local servers (`evalkit stub`
gives two for a first try). docs/workloads.md walks through it; the shipped resume workload is
the same shape, spread over data/, rubrics/ and the bundled matrices.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "support_reply",
    "type": "object",
    "properties": {
        "reply": {"type": "string", "minLength": 1, "maxLength": 800},
        "category": {"type": "string", "enum": ["billing", "shipping", "account", "other"]},
    },
    "required": ["reply", "category"],
    "additionalProperties": False,
}

SYSTEM = ("You answer customer support messages for an online shop. Reply with one JSON object: "
          "{\"reply\": the answer to the customer, \"category\": billing, shipping, account or other}.")
CASES = [
    ("refund-late", "billing", "I was charged twice for order 1182. Can I get one of the payments back?"),
    ("where-is-parcel", "shipping", "My parcel was due on Monday and the tracking has not moved since Friday."),
    ("reset-password", "account", "I cannot log in: the password reset email never arrives."),
    ("change-address", "shipping", "Can I still change the delivery address of an order I placed an hour ago?"),
    ("invoice-vat", "billing", "I need an invoice with my company's VAT number for last month's order."),
    ("close-account", "account", "Please delete my account and everything you store about me."),
    ("damaged-item", "shipping", "The mug I ordered arrived in pieces. What do I do now?"),
    ("card-declined", "billing", "My card keeps getting declined at checkout although it works elsewhere."),
    ("two-factor", "account", "I lost the phone I used for two-factor login. How do I get back into my account?"),
    ("gift-wrap", "other", "Do you offer gift wrapping, and can I add a note to the parcel?"),
]

MATRIX = """\
# A workload of your own (docs/workloads.md). Point the two variants at your servers: any
# OpenAI-compatible endpoint (vLLM, a hosted API with `api_key_env: NAME_OF_THE_VARIABLE`), or
# launch a model with `model:` and `vllm_args:` instead of `endpoint:`: a Hugging Face id, a checkpoint
# folder, or a bundled one (`evalkit models`: bundled:smollm2-135m-instruct and its -w8a8).
name: support-replies
baseline: current
margins: {e2e_mean: +10%, schema_pass: -10pp}
graders: [schema, drift, replylen:ReplyLength]   # replylen.py is beside this file
generation:
  max_tokens: 128
  temperature: 0.7
  structured_output: true     # each case's schema goes with its request as response_format
variants:
  - name: current
    endpoint: http://127.0.0.1:8101
  - name: candidate
    endpoint: http://127.0.0.1:8102
"""

GRADER = '''\
"""A grader of this workload's own: how long each reply is (no package, no install: the matrix
names it as `replylen:ReplyLength`)."""

from __future__ import annotations

import json
from typing import Any

from evalkit.grading import Aggregate, GradedRequest, Grader, Margin, Metric, Score, Threshold, mean, pass_pct


class ReplyLengthAggregate(Aggregate):
    columns = (Metric("reply_words_mean", "reply words", 0, "mean words per reply", "words"),
               Metric("reply_short_pct", "≤ 80 words %", 0, "replies of at most 80 words", "%"))
    thresholds = (Threshold("reply_words_mean", "reply_words_mean", "max", "maximum mean words per reply"),)
    margins = (Margin("reply_words", "abs", False, "words per reply, candidate minus baseline"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"reply_words_mean": mean([g["value"] for g in grades]), "reply_short_pct": pass_pct(grades)}


class ReplyLength(Grader):
    name = "replylen"
    version = "1"
    default = False
    description = "words in the reply field"
    requires = ("schema",)  # it reads the JSON reply
    aggregate = ReplyLengthAggregate

    def grade(self, item: GradedRequest) -> Score:
        try:
            reply = str(json.loads(item.text).get("reply", ""))
        except (ValueError, AttributeError):
            return Score(0.0, False, "not a JSON object with a reply")
        n = len(reply.split())
        return Score(float(n), n <= 80, f"{n} words")
'''

README = """\
# support-replies: a workload of your own

- `dataset.jsonl`: the cases (`id`, `messages`, `schema`, and `category`, an attribute to slice by)
- `schemas/support_reply.schema.json`: what a reply must look like
- `matrix.yaml`: two endpoints to compare, the margins a verdict uses, the graders
- `replylen.py`: a grader of this workload's own

Try it against two local stub servers, then against yours:

```bash
evalkit stub --port 8101 &
evalkit stub --port 8102 --ttft-ms 30 &
evalkit dataset validate --workload .
evalkit run --workload . --ledger support.db
evalkit report --ledger support.db --by category
```
"""


def scaffold(folder: Path) -> list[Path]:
    """Write a runnable workload into ``folder`` (new or empty); returns the files written."""
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"init: {folder} is not empty: give a new folder")
    (folder / "schemas").mkdir(parents=True, exist_ok=True)
    rows = [{"id": cid, "category": cat, "schema": "support_reply",
             "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}
            for cid, cat, text in CASES]
    files = {
        folder / "dataset.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        folder / "schemas" / "support_reply.schema.json": json.dumps(SCHEMA, indent=2) + "\n",
        folder / "matrix.yaml": MATRIX,
        folder / "replylen.py": GRADER,
        folder / "README.md": README,
    }
    for p, text in files.items():
        p.write_text(text, encoding="utf-8")
    return list(files)
