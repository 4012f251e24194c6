"""The `choice` suite and multiple-choice scoring by log-likelihood (teacher-forced), as pure math.

Log-likelihood scoring (lm-evaluation-harness's `multiple_choice` tasks): the context is the
question (`context`), each option is a continuation (`continuations`: `" " + option`), and a
server scores each continuation's tokens given the context. From each option's summed log
probability and its length, `choose` picks:

- **acc**: the option with the highest summed log-probability;
- **acc_norm**: the highest sum divided by the continuation's length in **characters** (Python
  `len` of the continuation string, leading space included): what lm-eval's `acc_norm` computes
  (`len(continuation)`); for ASCII text characters and bytes agree;
- **acc_bytes**: divided by its length in UTF-8 bytes (lm-eval's `acc_bytes`);
- **acc_tokens**: divided by its token count (the per-token mean).

Ties go to the first option, as `numpy.argmax` does. Fetching the log-probabilities is not done
here. The same items can be run generatively (`ChoiceItem.prompt`: answer with the letter), graded
by letter extraction (`extract.extract_letter`).

The shipped items (`data/choice.jsonl`, written for evalkit) use the Hugging Face MMLU layout
(`question`, `subject`, `choices`, `answer` 0-3) with an `id`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..errors import SuiteError
from .items import ChoiceItem, Item, Suite

DATA_FILE = "choice.jsonl"


def context(item: ChoiceItem) -> str:
    """The teacher-forced context every option continues."""
    return f"Question: {item.question.strip()}\nAnswer:"


def continuations(item: ChoiceItem) -> list[str]:
    """What is scored after the context, one per option (a leading space, as lm-eval does)."""
    return [" " + o for o in item.options]


@dataclass(frozen=True)
class OptionScore:
    """One option's teacher-forced score: the summed log-probability of its continuation's tokens,
    and the continuation's length in tokens, characters and UTF-8 bytes."""

    logprob: float
    tokens: int
    chars: int
    bytes: int

    @classmethod
    def of(cls, continuation: str, logprob: float, tokens: int) -> OptionScore:
        return cls(logprob, tokens, len(continuation), len(continuation.encode("utf-8")))


@dataclass(frozen=True)
class Choice:
    """The option each rule picks (indices)."""

    acc: int
    acc_norm: int
    acc_bytes: int
    acc_tokens: int

    def correct(self, gold: int) -> dict[str, bool]:
        return {"acc": self.acc == gold, "acc_norm": self.acc_norm == gold, "acc_bytes": self.acc_bytes == gold,
                "acc_tokens": self.acc_tokens == gold}


def _argmax(xs: list[float]) -> int:
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def choose(scores: list[OptionScore]) -> Choice:
    """The option picked by each rule; a length of 0 is refused (no continuation to normalise)."""
    if not scores:
        raise ValueError("no options to choose from")
    for i, s in enumerate(scores):
        if s.tokens < 1 or s.chars < 1 or s.bytes < 1:
            raise ValueError(f"option {i}: an empty continuation cannot be scored")
    return Choice(acc=_argmax([s.logprob for s in scores]),
                  acc_norm=_argmax([s.logprob / s.chars for s in scores]),
                  acc_bytes=_argmax([s.logprob / s.bytes for s in scores]),
                  acc_tokens=_argmax([s.logprob / s.tokens for s in scores]))


def accuracy(choices: list[Choice], golds: list[int]) -> dict[str, float]:
    """Each rule's accuracy (0-1) over items."""
    if len(choices) != len(golds) or not golds:
        raise ValueError("one gold index per choice, at least one")
    hits = [c.correct(g) for c, g in zip(choices, golds, strict=True)]
    return {k: sum(h[k] for h in hits) / len(hits) for k in ("acc", "acc_norm", "acc_bytes", "acc_tokens")}


def hf_choice_row(row: dict[str, Any], where: str, item_id: str, category: str | None = None) -> ChoiceItem:
    """A row in the Hugging Face MMLU layout: `question`, `subject`, `choices` (a list), `answer`
    (the gold index; a letter A-D is accepted too). ``category`` overrides the subject."""
    q, opts, ans = row.get("question"), row.get("choices"), row.get("answer")
    if not isinstance(q, str) or not q.strip():
        raise SuiteError(f"{where}: field 'question': expected a non-empty string")
    if hasattr(opts, "tolist"):
        opts = opts.tolist()  # a parquet list column read through numpy
    if not isinstance(opts, list) or not 2 <= len(opts) <= 10 or not all(isinstance(o, str) and o.strip() for o in opts):
        raise SuiteError(f"{where}: field 'choices': expected a list of 2-10 non-empty strings")
    if isinstance(ans, str) and len(ans) == 1 and ans.upper() in "ABCDEFGHIJ"[:len(opts)]:
        ans = "ABCDEFGHIJ".index(ans.upper())
    if isinstance(ans, bool) or not isinstance(ans, int) or not 0 <= ans < len(opts):
        raise SuiteError(f"{where}: field 'answer': expected the gold option's index 0-{len(opts) - 1}, got {ans!r}")
    subject = category or row.get("subject")
    if not isinstance(subject, str) or not subject.strip():
        raise SuiteError(f"{where}: field 'subject': expected a non-empty string")
    return ChoiceItem(item_id, q, tuple(opts), ans, subject, subject)


def shipped_choice() -> Suite:
    """The `choice` suite: evalkit's own four-option items."""
    text = resources.files("evalkit.suites").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    items: list[Item] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            row = json.loads(line)
            items.append(hf_choice_row(row, f"{DATA_FILE}:{lineno}", row["id"]))
    return Suite("choice", items)
