"""A light, dependency-free guess of a response's language, for `language:response_language`.

Two steps. First the script most letters are written in (from `unicodedata` names): a script that
only one supported language uses decides at once (Hangul: ko, Thai: th, Greek: el, ...), a
script several use (Cyrillic: ru/uk/bg, Arabic: ar/fa/ur, Devanagari: hi/mr/ne) is accepted for
any of them, since it cannot tell them apart. Then, for Latin-script text, stop-word ratios: the
share of words found in each language's list of frequent function words; the highest share wins
when it is at least `MIN_SHARE` and clearly above the runner-up.

What it can tell: English from French, Spanish, German, Italian, Portuguese, Dutch, Finnish,
Swahili and Vietnamese in ordinary prose of a few sentences; a response in the wrong script.
What it cannot: languages that share a non-Latin script (Russian vs Bulgarian, Hindi vs Marathi),
Latin-script languages without a list here (their codes are refused when a suite is read), very
short texts (under `MIN_LETTERS` letters: no verdict, which fails the check), or mixed-language
answers beyond "mostly X".
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

MIN_LETTERS = 20
MIN_SHARE = 0.08
MARGIN = 1.3  # the winner's share must beat the runner-up's by this factor

STOP_WORDS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "en": "the and of to a in is that it for was on are as with be this by at not from or have an they which you "
          "we but his her their has had were there been would will can all its our more when what these than",
    "fr": "le la les de des du un une et est que qui en dans pour pas sur au aux avec ce cette il elle nous vous ils "
          "sont ont plus mais par ou se son sa ses leur été être fait comme tout très",
    "es": "el la los las de del un una y es que en por para con no se su sus al lo como más pero este esta son "
          "fue ha muy también entre cuando hay nos ya todo",
    "de": "der die das den dem des und ist nicht ein eine einen zu mit von auf für im sich auch es sie wir ich "
          "aber wie oder wird sind hat bei nach noch nur werden dass",
    "it": "il lo la gli le di del della dei un una e è che non per con su da sono come anche più ma nel nella "
          "questo questa si ha alla delle degli",
    "pt": "o a os as de do da dos das um uma e é que em no na não por para com se mais mas como ao seu sua "
          "são foi também muito isso pelo pela",
    "nl": "de het een en van is dat niet op te in met voor zijn er aan ook als maar bij dit wordt om naar hij "
          "ze wij ik heeft door kan nog",
    "fi": "ja on ei se että oli ovat mutta tai kun niin hän me te he minä sinä tämä joka kuin myös jo vain mitä "
          "jos ole olla sen siitä",
    "sw": "na ya wa kwa ni za la katika cha hii kama lakini pia sana yake huo hiyo kuwa ili watu hakuna vya "
          "ambayo wake hao",
    "vi": "và của là có không những các một được cho người này trong với đã để khi như cũng thì rằng đến nhiều "
          "làm về",
}.items()}

# script (first word of a letter's Unicode name, or a group) -> the languages written in it
SCRIPTS: dict[str, tuple[str, ...]] = {
    "CYRILLIC": ("ru", "uk", "bg"), "ARABIC": ("ar", "fa", "ur"), "DEVANAGARI": ("hi", "mr", "ne"),
    "BENGALI": ("bn",), "GURMUKHI": ("pa",), "GUJARATI": ("gu",), "TAMIL": ("ta",), "TELUGU": ("te",),
    "KANNADA": ("kn",), "THAI": ("th",), "HANGUL": ("ko",), "KANA": ("ja",), "CJK": ("zh",), "GREEK": ("el",),
    "HEBREW": ("he",),
}
LATIN = tuple(STOP_WORDS)
SUPPORTED: frozenset[str] = frozenset(LATIN) | frozenset(c for codes in SCRIPTS.values() for c in codes)
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def _script(ch: str) -> str | None:
    name = unicodedata.name(ch, "")
    head = name.split(" ", 1)[0]
    if head in ("HIRAGANA", "KATAKANA"):
        return "KANA"
    if head == "CJK":
        return "CJK"
    if head in ("LATIN", "CYRILLIC", "ARABIC", "DEVANAGARI", "BENGALI", "GURMUKHI", "GUJARATI", "TAMIL", "TELUGU",
                "KANNADA", "THAI", "HANGUL", "GREEK", "HEBREW"):
        return head
    return None


def main_script(text: str) -> str | None:
    """The script most of the text's letters are written in (None under `MIN_LETTERS` letters).
    Japanese mixes kana with Chinese characters, so any real share of kana makes it KANA."""
    counts = Counter(s for ch in text if ch.isalpha() and (s := _script(ch)))
    if sum(counts.values()) < MIN_LETTERS:
        return None
    if counts["KANA"] >= 0.1 * sum(counts.values()):
        return "KANA"
    return counts.most_common(1)[0][0]


def latin_shares(text: str) -> dict[str, float]:
    """Each Latin-script language's share of the words that are its stop words."""
    words = [w.lower() for w in _WORD.findall(text)]
    if not words:
        return {k: 0.0 for k in LATIN}
    return {k: sum(w in STOP_WORDS[k] for w in words) / len(words) for k in LATIN}


def detect(text: str) -> str | None:
    """The language code the text is most likely in, or None when it cannot tell (too short, a
    shared script, no clear winner among the stop-word lists)."""
    script = main_script(text)
    if script is None:
        return None
    if script != "LATIN":
        codes = SCRIPTS.get(script, ())
        return codes[0] if len(codes) == 1 else None
    shares = sorted(latin_shares(text).items(), key=lambda kv: -kv[1])
    (best, s1), (_, s2) = shares[0], shares[1]
    return best if s1 >= MIN_SHARE and s1 >= MARGIN * s2 else None


def is_language(text: str, code: str) -> bool:
    """Whether the text reads as written in ``code`` (an ISO 639-1 code in `SUPPORTED`). A shared
    script passes for every language written in it."""
    script = main_script(text)
    if script is None:
        return False
    if script != "LATIN":
        return code in SCRIPTS.get(script, ())
    return detect(text) == code
