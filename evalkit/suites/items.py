"""What a suite holds and how each item becomes a `Case`.

Three kinds of item, whatever suite they come from: `InstructionItem` (a prompt with verifiable
instructions: `instructions`, `ifeval:FILE`), `NumericItem` (a word problem with an exact numeric
answer: `arithmetic`, `gsm8k:FILE`) and `ChoiceItem` (a question with options and a gold index:
`choice`, `mmlu:FILE`, `arc:FILE`). A `Suite` is a named list of them.

A case's id is `suite/<suite>/<item id>`; its attributes carry what slicing, a clustered bootstrap
and the `accuracy` grader read (all JSON-serialisable):

    suite      the suite's name (instructions, arithmetic, choice, gsm8k, mmlu, arc, ifeval)
    scoring    how it is graded: instructions | numeric | choice
    category   instructions: the first instruction's group; arithmetic: the template;
               choice/mmlu: the subject; arc: challenge/easy (else the file stem); gsm8k: the file stem
    cluster    what a clustered bootstrap resamples: the template or the subject (gsm8k, arc,
               instructions and ifeval items are their own clusters)
    tier       arithmetic only: 1-3
    suite_max_tokens  the output length the item needs (not `Case.max_tokens`, which the sender
               reads as a trace row's fixed length and sends with ignore_eos)
    instructions  [{"id": ..., "kwargs": {...}}]            (scoring instructions)
    answer        the exact answer as a decimal string      (scoring numeric)
    options, gold, gold_letter                              (scoring choice)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..spec.dataset import Case
from .checks import INSTRUCTIONS

LETTERS = "ABCDEFGHIJ"
Scoring = Literal["instructions", "numeric", "choice"]

# output lengths: a worked answer needs room, a letter does not
NUMERIC_MAX_TOKENS = 512
CHOICE_MAX_TOKENS = 64
INSTRUCTION_MAX_TOKENS = 768
INSTRUCTION_MAX_TOKENS_CAP = 2048

NUMERIC_SUFFIX = ("Solve the problem step by step. Then give the final answer on its own last line in the form "
                  "\"#### <number>\" (the number only: no units, no currency symbol).")


@dataclass(frozen=True)
class InstructionItem:
    id: str
    prompt: str
    instructions: tuple[tuple[str, dict[str, Any]], ...]  # (instruction id, its kwargs)

    @property
    def category(self) -> str:
        return INSTRUCTIONS[self.instructions[0][0]].group

    def max_tokens(self) -> int:
        """Room for the longest answer the instructions ask for (about 1.5 tokens a word)."""
        words = max([int(kw["num_words"]) for i, kw in self.instructions
                     if i == "length_constraints:number_words" and kw["relation"] != "less than"] or [0])
        return min(INSTRUCTION_MAX_TOKENS_CAP, max(INSTRUCTION_MAX_TOKENS, int(words * 1.5) + 256))


@dataclass(frozen=True)
class NumericItem:
    id: str
    question: str
    answer: str  # a normalised decimal string: "1000", "12.5", "-3"
    category: str
    cluster: str
    tier: int | None = None
    params: dict[str, Any] = field(default_factory=dict)  # what a generated item was made from

    def prompt(self) -> str:
        return f"{self.question}\n\n{NUMERIC_SUFFIX}"


@dataclass(frozen=True)
class ChoiceItem:
    id: str
    question: str
    options: tuple[str, ...]
    gold: int
    category: str
    cluster: str

    def prompt(self) -> str:
        """The item as a generation prompt: lettered options, answer with the letter."""
        letters = LETTERS[:len(self.options)]
        subject = self.category.replace("_", " ")
        lines = [f"The following is a multiple-choice question about {subject}.", "", self.question.strip()]
        lines += [f"{letter}. {opt}" for letter, opt in zip(letters, self.options, strict=True)]
        listed = ", ".join(letters[:-1]) + f" or {letters[-1]}"
        lines += ["", f"Answer with the letter of the correct option ({listed})."]
        return "\n".join(lines)


Item = InstructionItem | NumericItem | ChoiceItem


@dataclass
class Suite:
    """A named list of items, where they came from (`shipped` or a file), and what reading them
    left out (a `skip` policy's notes)."""

    name: str
    items: list[Item]
    source: str = "shipped"
    notes: list[str] = field(default_factory=list)

    def cases(self) -> list[Case]:
        return [item_case(self.name, i) for i in self.items]


def scoring_of(item: Item) -> Scoring:
    if isinstance(item, InstructionItem):
        return "instructions"
    return "numeric" if isinstance(item, NumericItem) else "choice"


def item_case(suite: str, item: Item) -> Case:
    """One item as a case: id `suite/<suite>/<item id>`, one user message, its attributes."""
    attrs: dict[str, Any] = {"suite": suite, "scoring": scoring_of(item), "category": item.category}
    if isinstance(item, InstructionItem):
        attrs["cluster"] = item.id
        attrs["instructions"] = [{"id": i, "kwargs": dict(kw)} for i, kw in item.instructions]
        content, max_tokens, reference = item.prompt, item.max_tokens(), None
    elif isinstance(item, NumericItem):
        attrs.update(cluster=item.cluster, answer=item.answer)
        if item.tier is not None:
            attrs["tier"] = item.tier
        content, max_tokens, reference = item.prompt(), NUMERIC_MAX_TOKENS, item.answer
    else:
        attrs.update(cluster=item.cluster, options=list(item.options), gold=item.gold, gold_letter=LETTERS[item.gold],
                     question=item.question)  # the log-likelihood scoring's context (`choice.context`)
        content, max_tokens, reference = item.prompt(), CHOICE_MAX_TOKENS, LETTERS[item.gold]
    # not `Case.max_tokens`: the sender reads that as a trace row's fixed length and sends ignore_eos
    attrs["suite_max_tokens"] = max_tokens
    return Case.model_validate({"id": f"suite/{suite}/{item.id}", "messages": [{"role": "user", "content": content}],
                                "reference": reference, "attributes": attrs})
