"""Answers pulled out of free text, saying how each was parsed or that it could not be.

Numbers, tried in order (the first rule that finds one wins; within a rule the last occurrence):

- `hash`: `#### N` (GSM8K's answer line, what the suites' prompts ask for);
- `boxed`: `\\boxed{N}`;
- `answer_is`: "the answer is N", "answer: N", "final answer = N" (markdown `**` allowed);
- `last_number`: the last number anywhere in the text.

A number may carry a sign, `$`/`€`/`£`, thousands commas, a decimal part, a unit or a full stop
after it; it is compared exactly after normalisation (`1,000.0` == `1000`, `numbers.same_number`).
A text with no number at all is `unparsed`.

Letters (A-D, or as many as the item has options), tried in order:

- `answer_is`: "the answer is (D)", "Answer: C", "answer is **B**", "the correct option is B";
- `letter`: the response starts with the letter alone or followed by `.`, `)`, `:` (`B`, `(B)`,
  `B. Paris`), not a word that begins with it ("A cat ...");
- `letter_paren`: exactly one distinct `(X)` in the text;
- `option_text`: the whole response is exactly one option's text;

otherwise `unparsed` (several different `(X)`, no letter at all, a letter beyond the options).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .numbers import NUMBER, numbers_in

UNPARSED = "unparsed"


@dataclass(frozen=True)
class Extraction:
    """What was extracted (a canonical number or a letter) and how; ``value`` is None when
    ``how`` is "unparsed"."""

    value: str | None
    how: str

    @property
    def parsed(self) -> bool:
        return self.value is not None


_HASH = re.compile(r"####\s*(.*)")
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"(?:answer|result)\s*(?:is|:|=)\s*[:*_\s]*(.*)", re.IGNORECASE)


def _first_number(text: str) -> str | None:
    found = numbers_in(text.replace("*", " "))
    return found[0] if found else None


def extract_number(text: str) -> Extraction:
    """The final numeric answer of a response, and which rule found it."""
    for how, pattern in (("hash", _HASH), ("boxed", _BOXED), ("answer_is", _ANSWER_IS)):
        for m in reversed(list(pattern.finditer(text))):
            head = m.group(1).split("\n", 1)[0]
            if (n := _first_number(head)) is not None:
                return Extraction(n, how)
    found = numbers_in(text)
    return Extraction(found[-1], "last_number") if found else Extraction(None, UNPARSED)


def reference_number(answer: str) -> str | None:
    """The `#### N` answer of a GSM8K reference solution (canonical), or None when it has none:
    a reference without one is a data error, not something to guess."""
    m = list(_HASH.finditer(answer))
    if not m:
        return None
    found = NUMBER.findall(m[-1].group(1))
    return _first_number(m[-1].group(1)) if len(found) == 1 else None


def extract_letter(text: str, n_options: int = 4, options: list[str] | None = None) -> Extraction:
    """The chosen option's letter (A.., as many as ``n_options``), and which rule found it."""
    letters = "ABCDEFGHIJ"[:n_options]
    cls = f"[{letters}]"
    s = text.strip()
    said = list(re.finditer(rf"(?:answer|option|choice)\s*(?:is|:)\s*(?:option\s*)?[*_\s]*\(?({cls})\)?(?![\w])", s,
                            re.IGNORECASE))
    said = [m for m in said if m.group(1).isupper()]
    if said:
        return Extraction(said[-1].group(1), "answer_is")
    m = re.match(rf"^[*_\s]*\(?({cls})\)?[*_]*(?:[.):]|\s*$|\s+[-–—])", s)
    if m:
        return Extraction(m.group(1), "letter")
    parens = {x for x in re.findall(rf"\(({cls})\)", s)}
    if len(parens) == 1:
        return Extraction(parens.pop(), "letter_paren")
    if options:
        bare = s.strip(" .*_\"'").casefold()
        hits = [i for i, o in enumerate(options[:n_options]) if o.strip(" .").casefold() == bare]
        if len(hits) == 1:
            return Extraction(letters[hits[0]], "option_text")
    return Extraction(None, UNPARSED)
