"""Sizes in input files: `600MiB`, `1.5GiB`, `800MB`, bytes, or a factor like `1.25x`."""

from __future__ import annotations

import re
from typing import Any

UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
         "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_FACTOR = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*x\s*$", re.IGNORECASE)


def check_budget(v: Any) -> Any:
    """A matrix's `memory_budget`: a size (`600MiB`, `1.5GiB`, bytes) or `1.25x` (times the
    baseline's weights). Raises ValueError with a reason (pydantic names the field and line)."""
    if v is None:
        return None
    s = str(v)
    if m := _FACTOR.match(s):
        if float(m.group(1)) <= 1:
            raise ValueError(f"{s!r}: a factor of the baseline's weights must be above 1x (the KV cache needs room)")
        return s.strip()
    m = _SIZE.match(s)
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"{s!r} is not a size: use e.g. 600MiB, 1.5GiB, 800MB, or 1.25x (of the baseline's weights)")
    if float(m.group(1)) <= 0:
        raise ValueError(f"{s!r}: a memory budget must be positive")
    return s.strip()


def budget_bytes(spec: str, baseline_weights: int | None) -> int:
    if m := _FACTOR.match(spec):
        if baseline_weights is None:
            raise ValueError("a budget relative to the baseline's weights needs a launched baseline with a local "
                             "checkpoint")
        return int(float(m.group(1)) * baseline_weights)
    m = _SIZE.match(spec)
    assert m
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
