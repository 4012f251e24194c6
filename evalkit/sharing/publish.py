"""Publish a ledger as a Hugging Face dataset: parquet per config (requests, grades, server
series, summary, ...) and a dataset card with the run config, definitions and summary table.
`--out DIR` writes the same files locally; the push needs a token from the environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..grading.registry import available, use_run
from ..host import host_line
from ..ledger import Ledger
from ..paths import PROJECT_DIR
from ..redact import SECRET_ENV_HINT, SECRET_PATTERNS
from ..reporting.document import markdown, sections, study_table
from ..reporting.findings import report_findings
from ..reporting.reviews import review_lines

TOKEN_ENVS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def find_secret(rows: list[dict[str, Any]], where: str) -> str | None:
    """A description of the first value that looks like a secret, or None."""
    env_secrets = [v for k, v in os.environ.items() if SECRET_ENV_HINT.search(k) and len(v) >= 8]
    for i, row in enumerate(rows):
        for k, v in row.items():
            if not isinstance(v, str):
                continue
            if any(s in v for s in env_secrets) or any(p.search(v) for p, _ in SECRET_PATTERNS):
                return f"{where} row {i + 1}, column '{k}'"
    return None


def _card(ledger: Ledger, run_id: str, configs: dict[str, int], rep: dict[str, Any], f: dict[str, Any]) -> str:
    run = ledger.require_run(run_id)
    # the report's own sections, each under its heading: whatever the terminal shows, the card shows
    body = "\n\n".join(f"## {sec.title}\n\n{markdown(sec.blocks)}" for sec in sections(rep, f, f.get("by"))
                         if sec.key != "run")
    variant_lines = "\n".join(f"- `{v['name']}`: {v.get('model')}, dtype {v.get('dtype') or '-'}"
                              + (f" ({v['dtype_reason']})" if v.get("dtype_reason") else "")
                              + f", quantization {v.get('quantization') or 'none'}" for v in rep["variants"])
    yaml_configs = "\n".join(f"- config_name: {c}\n  data_files: {c}/*.parquet" for c in configs)
    heads, rows = study_table(rep, f)
    summary = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    grader_lines = "\n".join(
        f"- **{name}** v{cls.version}: {cls.description}. Columns: "
        + "; ".join(f"`{c.key}` ({c.label}): {c.describe() or '-'}" for c in cls.aggregate.columns)
        for name, cls in available().items() if name in rep["graders"])
    review_section = ("## Human review\n\nPeople's verdicts on baseline/candidate pairs (`evalkit browse --review`; the "
                      "`reviews` config):\n\n" + "\n".join(f"- {x}" for x in review_lines(f.get("reviews")))
                      if f.get("reviews") else "")
    metrics_doc = (PROJECT_DIR / "docs" / "measuring.md").read_text(encoding="utf-8") \
        if (PROJECT_DIR / "docs" / "measuring.md").exists() else ""
    return f"""---
configs:
{yaml_configs}
tags:
- evalkit
- vllm
- llm-evaluation
---

# evalkit ledger: {run['matrix_name']}

Run `{run_id}` ({run['created_at']}), dataset hash `{run['dataset_hash']}`, evalkit {run['evalkit_version']}.

Every figure below came from this machine ({host_line(rep.get("host"))}). Machines of one
nominal size differ (an AVX2-only CPU ran the same bf16 prefill 15-17x slower than an AVX-512 BF16
one): compare runs within one host.
{variant_lines}
Rows per config: {", ".join(f"{k} {v}" for k, v in configs.items())}.

## Summary

| {" | ".join(heads)} |
|{"---|" * len(heads)}
{summary}

## Graders

{grader_lines}

{review_section}

{body}

## Run configuration

```json
{json.dumps(run.matrix, indent=2)}
```

Load: `{run['load_json']}`

{metrics_doc}
"""


def export(ledger: Ledger, out: Path, run_id: str | None = None) -> dict[str, int]:
    """Write parquet files + README.md (the dataset card) into ``out``; refuses secrets."""
    import datasets

    run = ledger.require_run(run_id)
    run_id = run["id"]
    use_run(run)  # its graders' columns in the card, from any directory
    tables = ledger.export_tables(run_id)
    for name, rows in tables.items():
        where = find_secret(rows, name)
        if where:
            raise UsageError(f"refusing to publish: a value in {where} looks like a secret")
    rep, fnd = report_findings(ledger, run_id)
    summary = [{k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in s.items()}
               for s in fnd["study_summary"]]
    # a column no variant has (a grader the run did not use, a slice its cases lack) is not published empty
    filled = {k for row in summary for k, v in row.items() if v is not None}
    tables["summary"] = [{k: v for k, v in row.items() if k in filled} for row in summary]
    tmp = Path(tempfile.mkdtemp(prefix=".evalkit-publish-", dir=out.parent if out.parent.exists() else None))
    counts = {}
    try:
        for name, rows in tables.items():
            if not rows:
                continue
            (tmp / name).mkdir()
            datasets.Dataset.from_list(rows).to_parquet(str(tmp / name / "data.parquet"))
            counts[name] = len(rows)
        (tmp / "README.md").write_text(_card(ledger, run_id, counts, rep, fnd), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # all or nothing
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts


def push(folder: Path, repo: str, private: bool, api: Any = None) -> str:
    if not re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", repo):
        raise UsageError(f"--repo: '{repo}' is not OWNER/NAME")
    token = next((os.environ[e] for e in TOKEN_ENVS if os.environ.get(e)), None)
    if not token:
        raise UsageError(f"publishing to the hub needs a token in ${TOKEN_ENVS[0]} (never a flag or a file)")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="dataset",
                      commit_message="evalkit: publish ledger")
    return f"https://huggingface.co/datasets/{repo}"
