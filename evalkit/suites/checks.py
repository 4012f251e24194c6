"""Verifiable instructions: one programmatic checker per instruction id, in IFEval's categories and
under IFEval's ids (`length_constraints:number_words`, ...), so a user's own `input_data.jsonl`
maps onto them, plus `startend:start_checker` (ours: the response starts with a phrase).

Each `Instruction` declares its keyword arguments (names as in IFEval), how to check a response
and how to say the instruction in a prompt (`describe`). The checks follow IFEval's definitions
where they are simple (a keyword is counted as a case-insensitive substring, paragraphs of
`number_paragraphs` are split on `***`, highlights are `*...*` spans) and are dependency-free
where IFEval uses nltk or langdetect: words are `\\w+` runs, sentences end at `.`, `!` or `?`
followed by a space or the end (common abbreviations and decimals excepted), and the language is
guessed by `language.py`. Relations: IFEval's "less than" and "at least", and our "at most" and
"exactly".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .language import SUPPORTED, is_language

RELATIONS = ("less than", "at least", "at most", "exactly")
LANGUAGE_NAMES = {"en": "English", "fr": "French", "es": "Spanish", "de": "German", "it": "Italian", "pt": "Portuguese",
                  "nl": "Dutch", "fi": "Finnish", "sw": "Swahili", "vi": "Vietnamese", "ru": "Russian",
                  "uk": "Ukrainian", "bg": "Bulgarian", "ar": "Arabic", "fa": "Persian", "ur": "Urdu", "hi": "Hindi",
                  "mr": "Marathi", "ne": "Nepali", "bn": "Bengali", "pa": "Punjabi", "gu": "Gujarati", "ta": "Tamil",
                  "te": "Telugu", "kn": "Kannada", "th": "Thai", "ko": "Korean", "ja": "Japanese", "zh": "Chinese",
                  "el": "Greek", "he": "Hebrew"}
CONSTRAINED = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|vs|etc|e\.g|i\.e|a\.m|p\.m|U\.S|approx|no)\.$", re.IGNORECASE)


def compare(n: int, relation: str, k: int) -> bool:
    if relation == "less than":
        return n < k
    if relation == "at least":
        return n >= k
    if relation == "at most":
        return n <= k
    return n == k


def count_words(text: str) -> int:
    """Words as runs of word characters (IFEval's nltk `RegexpTokenizer(r"\\w+")`)."""
    return len(re.findall(r"\w+", text))


def split_sentences(text: str) -> list[str]:
    """Sentences ending at `.`, `!` or `?` (runs of them) before whitespace or the end; a full stop
    after a common abbreviation or inside a number does not end one. Blank lines end one too."""
    out, start = [], 0
    for m in re.finditer(r"[.!?]+(?=\s|$)|\n\s*\n", text):
        piece = text[start:m.end()]
        if m.group().startswith(".") and _ABBREV.search(piece.rstrip()):
            continue
        if piece.strip(" \n\t.!?*-#"):
            out.append(piece.strip())
        start = m.end()
    if text[start:].strip(" \n\t.!?*-#"):
        out.append(text[start:].strip())
    return out


def _paragraphs_stars(text: str) -> int | None:
    """Paragraphs split by `***` (IFEval): an empty one inside the text is no valid split (None)."""
    parts = re.split(r"\s?\*\*\*\s?", text)
    n = len(parts)
    for i, p in enumerate(parts):
        if not p.strip():
            if i in (0, len(parts) - 1):
                n -= 1
            else:
                return None
    return n


def _highlights(text: str) -> int:
    spans = re.findall(r"\*[^\n*]*\*", text) + re.findall(r"\*\*[^\n*]*\*\*", text)
    return sum(1 for s in spans if s.strip("*").strip())


def _json(text: str) -> bool:
    s = text.strip()
    s = re.sub(r"^```(?:json)?\s*", "", s, flags=re.IGNORECASE)
    s = re.sub(r"\s*```$", "", s).strip()
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


def _postscript(text: str, marker: str) -> bool:
    low = text.lower()
    m = marker.lower().strip()
    if m == "p.p.s":
        pat = r"\s*p\.\s?p\.\s?s.*$"
    elif m == "p.s.":
        pat = r"\s*p\.\s?s\..*$"
    else:
        pat = r"\s*" + re.escape(m) + r".*$"
    return re.search(pat, low, flags=re.MULTILINE) is not None


def _sections(text: str, spliter: str, n: int) -> bool:
    parts = re.split(r"\s?" + re.escape(spliter) + r"\s?\d+\s?", text)
    return len(parts) - 1 >= n


def _two_responses(text: str) -> bool:
    parts = [p.strip() for p in text.split("******")]
    valid = [p for p in parts if p]
    # empty pieces only at the ends; two different answers
    inner_empty = any(not p for p in parts[1:-1])
    return not inner_empty and len(valid) == 2 and valid[0] != valid[1]


def _nth_paragraph(text: str, kw: dict[str, Any]) -> bool:
    paras = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paras) != kw["num_paragraphs"] or kw["nth_paragraph"] > len(paras):
        return False
    words = paras[kw["nth_paragraph"] - 1].strip().split()
    first = words[0].strip(" \"'*_#.,;:!?()[]").lower() if words else ""
    return first == kw["first_word"].strip().lower()


def _capital_words(text: str) -> int:
    return sum(1 for w in re.findall(r"\b[\w']+\b", text) if w.isupper())


@dataclass(frozen=True)
class Arg:
    """A keyword argument: its name (IFEval's), its type, and the values it may take."""

    name: str
    kind: type
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None


@dataclass(frozen=True)
class Instruction:
    id: str
    args: tuple[Arg, ...]
    check: Callable[[str, dict[str, Any]], bool]
    describe: Callable[[dict[str, Any]], str]
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        """`length_constraints`, `keywords`, ...: the category before the colon."""
        return self.id.split(":", 1)[0]


def _rel(kw: dict[str, Any], key: str = "relation") -> str:
    return {"less than": "fewer than", "at least": "at least", "at most": "at most", "exactly": "exactly"}[kw[key]]


def _n(kind: str = "n") -> Arg:
    return Arg(kind, int, minimum=1)


def _relation(name: str = "relation") -> Arg:
    return Arg(name, str, RELATIONS)


_LIST = [
    Instruction("length_constraints:number_words", (_n("num_words"), _relation()),
                lambda t, k: compare(count_words(t), k["relation"], k["num_words"]),
                lambda k: f"Your response should contain {_rel(k)} {k['num_words']} words."),
    Instruction("length_constraints:number_sentences", (_n("num_sentences"), _relation()),
                lambda t, k: compare(len(split_sentences(t)), k["relation"], k["num_sentences"]),
                lambda k: f"Your response should contain {_rel(k)} {k['num_sentences']} sentences."),
    Instruction("length_constraints:number_paragraphs", (_n("num_paragraphs"),),
                lambda t, k: _paragraphs_stars(t) == k["num_paragraphs"],
                lambda k: f"There should be exactly {k['num_paragraphs']} paragraphs. Paragraphs are separated from "
                          "each other by the markdown divider: ***"),
    Instruction("length_constraints:nth_paragraph_first_word",
                (_n("num_paragraphs"), _n("nth_paragraph"), Arg("first_word", str)), _nth_paragraph,
                lambda k: f"There should be exactly {k['num_paragraphs']} paragraphs, separated from each other by two "
                          f"new lines. Paragraph {k['nth_paragraph']} must start with the word \"{k['first_word']}\"."),
    Instruction("keywords:existence", (Arg("keywords", list),),
                lambda t, k: all(re.search(re.escape(w), t, re.IGNORECASE) for w in k["keywords"]),
                lambda k: "Include the keywords " + ", ".join(f'"{w}"' for w in k["keywords"]) + " in the response."),
    Instruction("keywords:forbidden_words", (Arg("forbidden_words", list),),
                lambda t, k: not any(re.search(r"\b" + re.escape(w) + r"\b", t, re.IGNORECASE)
                                     for w in k["forbidden_words"]),
                lambda k: "Do not include the words " + ", ".join(f'"{w}"' for w in k["forbidden_words"])
                          + " in the response."),
    Instruction("keywords:frequency", (Arg("keyword", str), _n("frequency"), _relation()),
                lambda t, k: compare(len(re.findall(re.escape(k["keyword"]), t, re.IGNORECASE)), k["relation"],
                                     k["frequency"]),
                lambda k: f"In your response, the word \"{k['keyword']}\" should appear {_rel(k)} "
                          f"{k['frequency']} times."),
    Instruction("keywords:letter_frequency", (Arg("letter", str), _n("let_frequency"), _relation("let_relation")),
                lambda t, k: compare(t.lower().count(k["letter"].lower()), k["let_relation"], k["let_frequency"]),
                lambda k: f"In your response, the letter \"{k['letter']}\" should appear {_rel(k, 'let_relation')} "
                          f"{k['let_frequency']} times."),
    Instruction("detectable_format:json_format", (), lambda t, k: _json(t),
                lambda k: "Your entire output should be wrapped in JSON format. You can use markdown ticks such as ```."),
    Instruction("detectable_format:number_bullet_lists", (_n("num_bullets"),),
                lambda t, k: len(re.findall(r"^\s*\*[^*].*$", t, re.MULTILINE))
                + len(re.findall(r"^\s*-.*$", t, re.MULTILINE)) == k["num_bullets"],
                lambda k: f"Your answer must contain exactly {k['num_bullets']} bullet points. Use the markdown bullet "
                          "points such as:\n* This is point 1."),
    Instruction("detectable_format:number_highlighted_sections", (_n("num_highlights"),),
                lambda t, k: _highlights(t) >= k["num_highlights"],
                lambda k: f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. "
                          "*highlighted section*."),
    Instruction("detectable_format:multiple_sections", (Arg("section_spliter", str), _n("num_sections")),
                lambda t, k: _sections(t, k["section_spliter"], k["num_sections"]),
                lambda k: f"Your response must have {k['num_sections']} sections. Mark the beginning of each section "
                          f"with {k['section_spliter']} X, such as: {k['section_spliter']} 1"),
    Instruction("detectable_format:title", (),
                lambda t, k: any(x.strip() for x in re.findall(r"<<([^\n]+)>>", t)),
                lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as "
                          "<<poem of joy>>."),
    Instruction("detectable_format:constrained_response", (),
                lambda t, k: any(c in t for c in CONSTRAINED),
                lambda k: "Answer with one of the following options: " + ", ".join(f'"{c}"' for c in CONSTRAINED)),
    Instruction("change_case:english_lowercase", (),
                lambda t, k: t == t.lower() and any(c.isalpha() for c in t),
                lambda k: "Your entire response should be in English, and in all lowercase letters. No capital "
                          "letters are allowed."),
    Instruction("change_case:english_capital", (), lambda t, k: t.isupper(),
                lambda k: "Your entire response should be in English, and in all capital letters."),
    Instruction("change_case:capital_word_frequency", (_n("capital_frequency"), _relation("capital_relation")),
                lambda t, k: compare(_capital_words(t), k["capital_relation"], k["capital_frequency"]),
                lambda k: f"In your response, words with all capital letters should appear "
                          f"{_rel(k, 'capital_relation')} {k['capital_frequency']} times."),
    Instruction("punctuation:no_comma", (), lambda t, k: "," not in t,
                lambda k: "In your entire response, refrain from the use of any commas."),
    Instruction("startend:end_checker", (Arg("end_phrase", str),),
                lambda t, k: t.strip().lower().endswith(k["end_phrase"].strip().lower()),
                lambda k: f"Finish your response with this exact phrase: \"{k['end_phrase']}\". No other words should "
                          "follow this phrase."),
    Instruction("startend:start_checker", (Arg("start_phrase", str),),
                lambda t, k: t.strip().lower().startswith(k["start_phrase"].strip().lower()),
                lambda k: f"Start your response with this exact phrase: \"{k['start_phrase']}\"."),
    Instruction("startend:quotation", (),
                lambda t, k: len(t.strip()) > 1 and t.strip()[0] == '"' and t.strip()[-1] == '"',
                lambda k: "Wrap your entire response with double quotation marks."),
    Instruction("detectable_content:postscript", (Arg("postscript_marker", str),),
                lambda t, k: _postscript(t, k["postscript_marker"]),
                lambda k: f"At the end of your response, please explicitly add a postscript starting with "
                          f"{k['postscript_marker']}"),
    Instruction("detectable_content:number_placeholders", (_n("num_placeholders"),),
                lambda t, k: len(re.findall(r"\[.*?\]", t)) >= k["num_placeholders"],
                lambda k: f"The response must contain at least {k['num_placeholders']} placeholders represented by "
                          "square brackets, such as [address]."),
    Instruction("language:response_language", (Arg("language", str, tuple(sorted(SUPPORTED))),),
                lambda t, k: is_language(t, k["language"]),
                lambda k: f"Your ENTIRE response should be in {LANGUAGE_NAMES.get(k['language'], k['language'])} "
                          "language, no other language is allowed."),
    Instruction("combination:two_responses", (), lambda t, k: _two_responses(t),
                lambda k: "Give two different responses. Responses and only responses should be separated by 6 "
                          "asterisk symbols: ******."),
    Instruction("combination:repeat_prompt", (Arg("prompt_to_repeat", str),),
                lambda t, k: t.strip().lower().startswith(k["prompt_to_repeat"].strip().lower()),
                lambda k: "First repeat the request word for word without change, then give your answer (do not say "
                          "anything before repeating the request; the request you need to repeat does not include "
                          "this sentence)"),
]
INSTRUCTIONS: dict[str, Instruction] = {i.id: i for i in _LIST}


def clean_kwargs(instruction_id: str, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The instruction's arguments, checked: None values dropped (Hugging Face's IFEval fills every
    row with every key), each required one present with the right type and value. Raises
    ValueError(`name: problem`) naming the argument; KeyError for an unknown instruction id."""
    ins = INSTRUCTIONS[instruction_id]
    kw = {k: v for k, v in (kwargs or {}).items() if v is not None}
    known = {a.name for a in ins.args}
    for k in kw:
        if k not in known:
            raise ValueError(f"{k}: not an argument of {instruction_id} (its arguments: {', '.join(sorted(known)) or 'none'})")
    out: dict[str, Any] = {}
    for a in ins.args:
        if a.name not in kw:
            raise ValueError(f"{a.name}: missing (required by {instruction_id})")
        v = kw[a.name]
        if a.kind is int and isinstance(v, float) and v.is_integer():
            v = int(v)
        if a.kind is list and isinstance(v, tuple):
            v = list(v)
        if isinstance(v, bool) or not isinstance(v, a.kind):
            raise ValueError(f"{a.name}: expected {a.kind.__name__}, got {type(v).__name__} {v!r}")
        if a.kind is list and (not v or not all(isinstance(x, str) and x for x in v)):
            raise ValueError(f"{a.name}: expected a non-empty list of words")
        if a.kind is str and not v.strip():
            raise ValueError(f"{a.name}: empty")
        if a.choices is not None and v not in a.choices:
            raise ValueError(f"{a.name}: {v!r} is not one of {', '.join(map(str, a.choices))}")
        if a.minimum is not None and v < a.minimum:
            raise ValueError(f"{a.name}: must be at least {a.minimum}, got {v}")
        out[a.name] = v
    if instruction_id == "keywords:letter_frequency" and len(out["letter"]) != 1:
        raise ValueError(f"letter: expected one letter, got {out['letter']!r}")
    return out


def check(instruction_id: str, text: str, kwargs: dict[str, Any]) -> bool:
    """Whether ``text`` follows the instruction (an empty response follows none)."""
    return bool(text.strip()) and INSTRUCTIONS[instruction_id].check(text, kwargs)


def describe(instruction_id: str, kwargs: dict[str, Any]) -> str:
    """The instruction as a prompt says it."""
    return INSTRUCTIONS[instruction_id].describe(kwargs)
