"""The findings read straight from the ledger in SQL, computed once for either findings driver
(`findings`, `streamed`): how the variants shared time and what the machine did (`timeshare`),
and task accuracy per suite (`suites`). Each driver merges this one dict, so both say the same."""

from __future__ import annotations

from typing import Any

from ..grading.margins import MarginSpec
from ..ledger import Ledger
from . import suites
from .timeshare import timeshare


def ledger_findings(ledger: Ledger, run_id: str, baseline: str | None, specs: list[MarginSpec],
                    repeats: int) -> dict[str, Any]:
    ts = timeshare(ledger, run_id, baseline, specs)
    acc = suites.suite_accuracy(ledger, run_id, baseline, repeats) + suites.choice_likelihood(ledger, run_id, baseline)
    return {"timeshare": ts, "accuracy": acc, "lines": suites.lines(acc, baseline) + ts["lines"]}
