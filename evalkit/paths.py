"""Where things live: the repo's data and rubrics, and the cache for prepared models."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_DIR = PACKAGE_DIR.parent


def rubrics_dir() -> Path:
    return Path(os.environ.get("EVALKIT_RUBRICS", PROJECT_DIR / "rubrics"))


def rubric_file(folder: Path | None, name: str) -> Path:
    """A rubric file from a workload's folder when it has one, else the shipped one."""
    own = folder / name if folder is not None else None
    return own if own is not None and own.exists() else rubrics_dir() / name


def schemas_dir() -> Path:
    return rubrics_dir() / "schemas"


def default_dataset_path() -> Path:
    return Path(os.environ.get("EVALKIT_DATASET", PROJECT_DIR / "data" / "resume_gen_benchmark.jsonl"))


def default_matrix_path() -> Path:
    return PACKAGE_DIR / "matrices" / "default.yaml"


def cache_dir() -> Path:
    base = os.environ.get("EVALKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "evalkit"
    )
    return Path(base)


def default_ledger_path() -> Path:
    return Path(os.environ.get("EVALKIT_LEDGER", "evalkit.db"))
