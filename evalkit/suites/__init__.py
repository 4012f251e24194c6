"""Evaluation suites as a library (issue 49): evalkit's own shipped suites (`instructions`:
verifiable instructions scored strict and loose; `arithmetic`: seeded exact-answer word problems
in tiers; `choice`: four-option questions, with the log-likelihood acc/acc_norm math), readers for
the user's own copies of GSM8K, MMLU, ARC and IFEval in their published layouts, answer extraction
that says how it parsed, and every item as a `Case` (`suite_cases`). Grading lives in
`evalkit.grading.accuracy`, the statistics in `evalkit.stats.accuracy`; docs/suites.md explains
each suite.

May import: the root modules (errors, stats, ...) and `evalkit.spec`; nothing higher. No network,
no model: everything here is offline and deterministic.
"""

from __future__ import annotations

from .arithmetic import TEMPLATES, generate, shipped_arithmetic
from .checks import INSTRUCTIONS, check, clean_kwargs, describe
from .choice import Choice, OptionScore, choose, context, continuations, shipped_choice
from .extract import UNPARSED, Extraction, extract_letter, extract_number, reference_number
from .instructions import InstructionResult, loose_variants, score_instructions, shipped_instructions
from .items import LETTERS, ChoiceItem, InstructionItem, Item, NumericItem, Suite, item_case
from .language import detect as detect_language
from .numbers import canonical, same_number
from .readers import read_arc, read_gsm8k, read_ifeval, read_mmlu
from .selection import SuiteSpec, known_names, load_suite, load_suites, parse_specs, stratified, suite_cases

__all__ = [
    "INSTRUCTIONS", "LETTERS", "TEMPLATES", "UNPARSED", "Choice", "ChoiceItem", "Extraction", "InstructionItem",
    "InstructionResult", "Item", "NumericItem", "OptionScore", "Suite", "SuiteSpec", "canonical", "check", "choose",
    "clean_kwargs", "context", "continuations", "describe", "detect_language", "extract_letter", "extract_number",
    "generate", "item_case", "known_names", "load_suite", "load_suites", "loose_variants", "parse_specs", "read_arc",
    "read_gsm8k", "read_ifeval", "read_mmlu", "reference_number", "same_number", "score_instructions",
    "shipped_arithmetic", "shipped_choice", "shipped_instructions", "stratified", "suite_cases",
]
