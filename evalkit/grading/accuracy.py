"""Accuracy on evaluation suites (`evalkit.suites`): each answer graded against the item it answers.

A case graded here carries a `suite` attribute and a `scoring` (docs/suites.md):

- `numeric` (arithmetic, gsm8k): the final number extracted (`#### N`, then "the answer is N",
  then the last number) equals the exact `answer` after normalisation;
- `choice` (choice, mmlu, arc), generatively: the letter extracted equals `gold_letter`
  (log-likelihood acc/acc_norm is `evalkit.suites.choice`, computed from a server's log-probs);
- `instructions` (instructions, ifeval): every instruction followed, strict (prompt level).

Value 1.0 or 0.0, `passed` True or False. **Unparsed**: when no number or letter could be parsed
the value is 0.0 and `passed` None, with `{"unparsed": true}` in the detail: accuracy counts it
wrong (it stays in the denominator: a variant that breaks the answer format loses accuracy for
it), and the aggregate counts it separately (`accuracy_unparsed`), since a quantization that
breaks the format is a finding of its own. An instruction check always decides: never unparsed.

The margin `accuracy` (pp) pairs each case's first repeat, unparsed as 0; `suite_margin_values`
splits the same values per suite (`accuracy:gsm8k`).
"""

from __future__ import annotations

from typing import Any

from ..catalogue import CaseValue, Metric
from ..stats import mean
from ..stats.accuracy import mcnemar_exact, recovery
from ..suites.checks import INSTRUCTIONS, clean_kwargs
from ..suites.extract import extract_letter, extract_number
from ..suites.instructions import score_instructions
from ..suites.items import LETTERS
from ..suites.numbers import parse_number, same_number
from .base import Aggregate, CannedQuery, GradedRequest, Grader, Margin, Score, Threshold

SCORINGS = ("numeric", "choice", "instructions")


def suite_of(grade: dict[str, Any]) -> str:
    """A grade's suite: its detail's, else the case id's `suite/<name>/...`."""
    detail = grade.get("detail") or {}
    if detail.get("suite"):
        return str(detail["suite"])
    parts = str(grade.get("case_id", "")).split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "suite" else "?"


def split_by_suite(grades: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in grades:
        out.setdefault(suite_of(g), []).append(g)
    return out


def _first_repeat(grades: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """case -> the grade of its first repeat (value not None)."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for g in grades:
        rep = g.get("repeat") or 0
        if g.get("value") is not None and (g["case_id"] not in out or rep < out[g["case_id"]][0]):
            out[g["case_id"]] = (rep, g)
    return {k: g for k, (_, g) in out.items()}


def _pct(xs: list[float]) -> float | None:
    m = mean(xs)
    return None if m is None else 100.0 * m


class AccuracyAggregate(Aggregate):
    columns = (
        Metric("accuracy_pct", "accuracy %", 1, "share of suite items answered correctly (unparsed answers count as "
               "wrong; instructions: every instruction followed, strict)", "%"),
        Metric("accuracy_unparsed", "unparsed", 0, "suite answers no number or letter could be parsed from (scored "
               "wrong, counted here too)", ""),
        Metric("accuracy_unparsed_pct", "unparsed %", 1, "share of suite answers that could not be parsed", "%"),
        Metric("instr_prompt_strict_pct", "instr. prompt strict %", 1, "instruction prompts with every instruction "
               "followed, response as given", "%"),
        Metric("instr_prompt_loose_pct", "instr. prompt loose %", 1, "instruction prompts with every instruction "
               "followed, allowing a first/last line or * markup to be dropped", "%"),
        Metric("instr_inst_strict_pct", "instr. level strict %", 1, "share of all instructions followed, strict", "%"),
        Metric("instr_inst_loose_pct", "instr. level loose %", 1, "share of all instructions followed, loose", "%"),
        Metric("recovery_pct", "recovery %", 1, "candidate accuracy / baseline accuracy on the same items", "%"),
        Metric("recovery_ci95", "recovery 95% CI", 1, "BCa paired cluster bootstrap interval of recovery", "%"),
    )
    headline = ("accuracy_pct",)
    thresholds = (
        Threshold("accuracy", "accuracy_pct", "min", "minimum share of suite items answered correctly, 0-1", scale=100.0),
        Threshold("accuracy_unparsed", "accuracy_unparsed_pct", "max", "maximum share of suite answers that could not "
                  "be parsed, 0-1", scale=100.0),
    )
    margins = (Margin("accuracy", "pp", True, "suite accuracy, candidate minus baseline, percentage points (unparsed "
                      "answers count as wrong); accuracy:SUITE for one suite (accuracy:gsm8k=-2pp)", qualified=True),)
    view_columns = (("accuracy_correct", "value"),)
    canned_queries = (CannedQuery("accuracy_wrong", "Suite items answered wrong", "failures"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        scored = [g for g in grades if g.get("value") is not None]
        unparsed = sum(1 for g in scored if (g.get("detail") or {}).get("unparsed"))
        ins = [g["detail"] for g in scored if (g.get("detail") or {}).get("scoring") == "instructions"]
        flat = [r for d in ins for r in d.get("instructions", [])]
        out: dict[str, Any] = {
            "accuracy_pct": _pct([float(g["value"]) for g in scored]),
            "accuracy_graded": len(scored),
            "accuracy_unparsed": unparsed if scored else None,
            "accuracy_unparsed_pct": 100.0 * unparsed / len(scored) if scored else None,
            "instr_prompt_strict_pct": _pct([float(d["prompt_strict"]) for d in ins]),
            "instr_prompt_loose_pct": _pct([float(d["prompt_loose"]) for d in ins]),
            "instr_inst_strict_pct": _pct([float(r["strict"]) for r in flat]),
            "instr_inst_loose_pct": _pct([float(r["loose"]) for r in flat]),
            "accuracy_by_suite": {s: _pct([float(g["value"]) for g in gs]) for s, gs in split_by_suite(scored).items()}
            if scored else None,
            "recovery_pct": None, "recovery_ci95": None, "recovery_method": None, "accuracy_mcnemar_p": None,
        }
        if base_grades and scored:
            out.update(paired_summary(grades, base_grades))
        return out

    @classmethod
    def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        """Each case's first repeat: 1.0 correct, 0.0 wrong or unparsed (the default would drop
        unparsed answers, whose `passed` is None); also per suite, as `accuracy:SUITE`."""
        first = _first_repeat(grades)
        out = {"accuracy": {c: float(g["value"]) for c, g in first.items()}}
        for c, g in first.items():
            out.setdefault(f"accuracy:{suite_of(g)}", {})[c] = float(g["value"])
        return out

    @classmethod
    def case_values(cls, baseline_side: bool) -> dict[str, CaseValue]:
        return {"accuracy": CaseValue("value", first=True, by_suite=True)}

    @classmethod
    def suite_margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        """suite -> case -> value: the `accuracy` margin split per suite (`accuracy:gsm8k=-2pp`)."""
        return {s: cls.margin_values(gs, baseline_side)["accuracy"] for s, gs in split_by_suite(grades).items()}


def paired_summary(grades: list[dict[str, Any]], base_grades: list[dict[str, Any]]) -> dict[str, Any]:
    """Recovery with its BCa cluster bootstrap interval and McNemar's exact p, on the cases both
    sides graded (first repeats), clustered by each case's `cluster`."""
    mine, theirs = _first_repeat(grades), _first_repeat(base_grades)
    cases = sorted(c for c in mine if c in theirs)
    if not cases:
        return {}
    cand = [bool(mine[c]["value"]) for c in cases]
    base = [bool(theirs[c]["value"]) for c in cases]
    clusters = [str((theirs[c].get("detail") or {}).get("cluster") or c) for c in cases]
    r = recovery(base, cand, clusters)
    lost = sum(1 for b, c in zip(base, cand, strict=True) if b and not c)
    gained = sum(1 for b, c in zip(base, cand, strict=True) if c and not b)
    return {"recovery_pct": r.estimate, "recovery_ci95": list(r.interval) if r.interval else None,
            "recovery_method": r.method, "accuracy_mcnemar_p": mcnemar_exact(lost, gained),
            "accuracy_lost": lost, "accuracy_gained": gained, "accuracy_pairs": len(cases)}


class AccuracyGrader(Grader):
    name = "accuracy"
    version = "1"
    description = "suite answers graded against their item: exact number, option letter, or instructions followed"
    requires = ("suite",)
    aggregate = AccuracyAggregate
    # only suite runs carry `suite`; a default grader would add a "skipped" line to every other run
    default = False

    @classmethod
    def check_case(cls, case: Any) -> str | None:
        """Why a suite case cannot be graded (`field: problem`), or None."""
        a = case.attributes
        scoring = a.get("scoring")
        if scoring not in SCORINGS:
            return f"scoring: expected one of {', '.join(SCORINGS)}, got {scoring!r}"
        if scoring == "numeric":
            if not isinstance(a.get("answer"), str) or parse_number(a["answer"]) is None:
                return f"answer: expected an exact number as a string, got {a.get('answer')!r}"
        elif scoring == "choice":
            opts, gold = a.get("options"), a.get("gold")
            if not isinstance(opts, list) or not 2 <= len(opts) <= len(LETTERS):
                return "options: expected a list of 2-10 options"
            if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(opts):
                return f"gold: expected the gold option's index 0-{len(opts) - 1}, got {gold!r}"
        else:
            ins = a.get("instructions")
            if not isinstance(ins, list) or not ins:
                return "instructions: expected a list of {id, kwargs}"
            for i, x in enumerate(ins):
                if not isinstance(x, dict) or x.get("id") not in INSTRUCTIONS:
                    return f"instructions[{i}].id: unknown instruction {x.get('id') if isinstance(x, dict) else x!r}"
                try:
                    clean_kwargs(x["id"], x.get("kwargs"))
                except ValueError as e:
                    return f"instructions[{i}].kwargs.{e}"
        return None

    def grade(self, item: GradedRequest) -> Score:
        a = item.case.attributes
        base = {"suite": a.get("suite"), "category": a.get("category"), "cluster": a.get("cluster") or item.case.id,
                "scoring": a.get("scoring"), "finish_reason": item.finish_reason}
        if a.get("scoring") == "instructions":
            return self._instructions(item.text, a, base)
        if a.get("scoring") == "choice":
            ex = extract_letter(item.text, len(a["options"]), a["options"])
            expected = LETTERS[a["gold"]]
            correct = ex.value == expected
        else:
            ex = extract_number(item.text)
            expected = a["answer"]
            correct = same_number(ex.value, expected)
        detail = {**base, "parsed_as": ex.how, "extracted": ex.value, "expected": expected, "unparsed": not ex.parsed}
        if not ex.parsed:
            why = " (truncated at max_tokens)" if item.finish_reason == "length" else ""
            return Score(0.0, None, f"unparsed: no {'letter' if a.get('scoring') == 'choice' else 'number'} found"
                         f"{why}; scored wrong", detail)
        verdict = "correct" if correct else "wrong"
        return Score(1.0 if correct else 0.0, correct, f"{verdict}: {ex.value} ({ex.how}), expected {expected}", detail)

    @staticmethod
    def _instructions(text: str, a: dict[str, Any], base: dict[str, Any]) -> Score:
        pairs = [(x["id"], clean_kwargs(x["id"], x.get("kwargs"))) for x in a["instructions"]]
        results = score_instructions(text, pairs)
        strict, loose = all(r.strict for r in results), all(r.loose for r in results)
        detail = {**base, "parsed_as": "instructions", "extracted": None, "expected": None, "unparsed": False,
                  "prompt_strict": strict, "prompt_loose": loose,
                  "instructions": [{"id": r.id, "strict": r.strict, "loose": r.loose} for r in results]}
        failed = [r.id for r in results if not r.strict]
        why = f"{len(results) - len(failed)} of {len(results)} instructions followed (strict)"
        return Score(1.0 if strict else 0.0, strict, why + (f"; not: {', '.join(failed)}" if failed else ""), detail)
