"""Build rubrics/judge_labels.jsonl, the LLM judge's labelled set, from the persona labels (people's
per-rule verdicts on real and written outreach texts, rubrics/persona_labels.jsonl). The judge's
two default criteria map onto those rules:

- faithfulness (only facts from the profile and job): `no_invented_facts`;
- persona_fit (addresses the recipient persona as they would value): `mentions_company` and
  `mentions_role` both (it names who they are and what the role is).

A text passes when both criteria do; texts without a label for each rule are left out.

    .venv/bin/python rubrics/judge_labels.py          # write the file
    .venv/bin/python rubrics/judge_labels.py check    # the committed file is what this makes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE, TARGET = HERE / "persona_labels.jsonl", HERE / "judge_labels.jsonl"


def build() -> str:
    out = []
    for i, line in enumerate(SOURCE.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        lab = row["labels"]
        if any(lab.get(k) is None for k in ("no_invented_facts", "mentions_company", "mentions_role")):
            continue
        crit = {"persona_fit": lab["mentions_company"] and lab["mentions_role"], "faithfulness": lab["no_invented_facts"]}
        out.append(json.dumps({"case_id": row["case_id"], "text": row["text"], "passed": all(crit.values()),
                               "labels": crit, "source": f"persona_labels.jsonl:{i}"}, ensure_ascii=False))
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        same = TARGET.read_text(encoding="utf-8") == build()
        print("judge_labels.jsonl is current" if same else "judge_labels.jsonl is stale: run rubrics/judge_labels.py")
        return 0 if same else 1
    TARGET.write_text(build(), encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
