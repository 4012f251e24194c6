"""What a checkpoint and its server arguments say about a variant: quantization and dtype."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..spec.matrix import arg_value


def _config(model_path: str | None) -> dict[str, Any]:
    cfg = Path(model_path) / "config.json" if model_path else None
    if cfg is None or not cfg.exists():
        return {}
    try:
        return json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def checkpoint_quantization(model_path: str | None) -> str | None:
    qc = _config(model_path).get("quantization_config") or {}
    if not qc:
        return None
    groups = qc.get("config_groups") or {}
    g = next(iter(groups.values()), {}) if groups else {}
    w, a = g.get("weights") or {}, g.get("input_activations") or {}
    bits = f"W{w.get('num_bits')}A{a.get('num_bits', 16)}" if w else ""
    return " ".join(x for x in (qc.get("quant_method"), bits, w.get("type")) if x) or None


def served_dtype(args: list[str], model_path: str | None) -> str | None:
    """The dtype the server computes in: `--dtype` when given (and not auto), else the
    checkpoint's own `torch_dtype` (what vLLM's auto picks)."""
    d = arg_value(args, "--dtype")
    if d and d != "auto":
        return d
    cfg = _config(model_path)
    return cfg.get("torch_dtype") or cfg.get("dtype") or d
