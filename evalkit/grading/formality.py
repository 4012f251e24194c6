"""Formality: predict the level 1-5 of a text from lexical and syntactic markers (offline,
deterministic), and compare it with the level the prompt demanded."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import load_yaml_model as _load
from ..errors import RubricError
from ..paths import rubrics_dir
from ..stats import mean
from .base import GradedRequest, Grader, Score, SummaryColumn
from .text import prose, sentences, words

FEATURES = (
    "contraction_rate", "informal_word_rate", "exclamation_rate", "emoji_count", "lowercase_start",
    "question_rate", "has_informal_greeting", "has_neutral_greeting", "has_formal_greeting",
    "has_very_formal_greeting", "has_informal_signoff", "has_neutral_signoff", "has_formal_signoff",
    "has_very_formal_signoff", "mean_sentence_words", "latinate_rate", "formal_phrase_count",
)

CONTRACTION = re.compile(
    r"\b(?:\w+n['’]t|i['’]m|i['’]ve|i['’]ll|i['’]d|you['’](?:re|ve|ll|d)|we['’](?:re|ve|ll|d)|"
    r"they['’](?:re|ve|ll|d)|(?:it|that|there|here|what|who|he|she|let)['’]s|gonna|wanna|gotta|lemme|gimme)\b",
    re.I,
)
INFORMAL = {
    "hey", "heya", "hiya", "yo", "sup", "lol", "haha", "omg", "btw", "tbh", "ngl", "lmk", "u", "ur", "cuz",
    "gonna", "wanna", "gotta", "kinda", "sorta", "stuff", "cool", "awesome", "super", "totally", "rad",
    "stoked", "keen", "jam", "nerd", "guys", "yeah", "yep", "nope", "hiii", "heyyy", "sooo", "vibes", "chill",
    "n", "tons", "loads", "bunch", "ok", "okay", "hi-hi", "hmu", "chat", "ping", "gig", "chops", "dream",
}
EMOJI = re.compile(r"[\U0001F300-\U0001FAFF\u2600-\u27BF]|(?<!\w)[:;]-?[)D(P](?!\w)")
LATINATE = re.compile(r"\w{3,}(?:tion|sion|ment|ity|ance|ence|ive|ous|ate|ure|ory)s?$", re.I)
FORMAL_PHRASES = [
    r"\bhereby\b", r"\bherewith\b", r"\bpursuant\b", r"\bI respectfully\b", r"\brespectfully (?:submit|request|present)",
    r"\bI (?:would|should) be (?:most |deeply )?(?:grateful|honoured|honored|appreciative)", r"\bI wish to\b",
    r"\bI have the (?:honour|honor|pleasure)\b", r"\bplease accept\b", r"\bin accordance with\b",
    r"\bat (?:your|the committee's) (?:convenience|disposal)\b", r"\bfurther to\b", r"\bwith reference to\b",
    r"\bI remain\b", r"\bI should like\b", r"\bconsider(?:ed)? it a privilege\b", r"\bcandidacy\b",
    r"\bI am writing to (?:formally )?(?:express|apply)", r"\bI would welcome\b",
]
GREETINGS = [
    ("has_very_formal_greeting",
     r"^(?:dear (?:members of|sir or madam|selection|hiring committee)|to the (?:members|selection|hiring|appointments))"),
    ("has_formal_greeting", r"^dear\b"),
    ("has_neutral_greeting", r"^(?:hello|good (?:morning|afternoon))\b"),
    ("has_informal_greeting", r"^(?:hey+|hi+|yo|hiya|heya|sup|howdy)\b"),
]
SIGNOFFS = [
    ("has_very_formal_signoff", r"\b(?:yours faithfully|respectfully(?: yours)?|yours respectfully)\b"),
    ("has_formal_signoff", r"\b(?:kind regards|yours sincerely|sincerely|warm regards|with regards)\b"),
    ("has_neutral_signoff", r"\b(?:best regards|regards|best|all the best|many thanks)\b"),
    ("has_informal_signoff", r"\b(?:cheers|talk soon|chat soon|thanks!|thx|later|ttyl|xo)\b"),
]


class FormalityRubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    intercept: float = 0.0
    weights: dict[str, float]
    thresholds: list[float] = Field(min_length=4, max_length=4)

    @field_validator("weights")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(unknown)} (known: {', '.join(FEATURES)})")
        return v

    @field_validator("thresholds")
    @classmethod
    def _ascending(cls, v: list[float]) -> list[float]:
        if v != sorted(v):
            raise ValueError("thresholds must be in ascending order")
        return v


def load_yaml_model(path: Path, model: type[BaseModel]) -> Any:
    """A rubric file into its pydantic model (errors name file:line and field)."""
    return _load(path, model, RubricError, "rubric")


@lru_cache(maxsize=8)
def _rubric(path: str) -> FormalityRubric:
    return load_yaml_model(Path(path), FormalityRubric)


def load_formality_rubric(path: Path | None = None) -> FormalityRubric:
    return _rubric(str(path or rubrics_dir() / "formality.yaml"))


def features(text: str) -> tuple[dict[str, float], list[str]]:
    """Feature values and the human-readable markers behind them."""
    t = text.strip()
    sents = sentences(t) or [t]
    n_s = max(1, len(sents))
    ws = words(t)
    lower_ws = [w.lower().strip("'’") for w in ws]
    markers: list[str] = []
    f: dict[str, float] = dict.fromkeys(FEATURES, 0.0)
    contractions = CONTRACTION.findall(t)
    f["contraction_rate"] = len(contractions) / n_s
    informal = [w for w in lower_ws if w in INFORMAL]
    f["informal_word_rate"] = len(informal) / n_s
    f["exclamation_rate"] = t.count("!") / n_s
    f["question_rate"] = t.count("?") / n_s
    f["emoji_count"] = min(3, len(EMOJI.findall(t)))
    starts = [s[0] for s in sents if s and s[0].isalpha()]
    f["lowercase_start"] = 1.0 if starts and sum(c.islower() for c in starts) / len(starts) > 0.5 else 0.0
    head = t[:60].lower()
    for name, pat in GREETINGS:
        if re.search(pat, head):
            f[name] = 1.0
            markers.append(f"greeting: {t.split(',')[0][:40]!r}")
            break
    tail = t[-80:].lower()
    for name, pat in SIGNOFFS:
        if re.search(pat, tail):
            f[name] = 1.0
            markers.append(f"sign-off ({name.removeprefix('has_').removesuffix('_signoff')})")
            break
    f["mean_sentence_words"] = len(ws) / n_s
    f["latinate_rate"] = sum(1 for w in ws if LATINATE.match(w)) / max(1, len(ws))
    phrases = [p for p in FORMAL_PHRASES if re.search(p, t, re.I)]
    f["formal_phrase_count"] = min(4, len(phrases))
    if contractions:
        markers.append(f"contractions: {', '.join(sorted({c.lower() for c in contractions})[:5])}")
    if informal:
        markers.append(f"informal words: {', '.join(sorted(set(informal))[:5])}")
    if f["exclamation_rate"]:
        markers.append(f"{t.count('!')} exclamation mark(s)")
    if f["emoji_count"]:
        markers.append("emoji/emoticons")
    if f["lowercase_start"]:
        markers.append("sentences start in lower case")
    if phrases:
        markers.append(f"{len(phrases)} formal phrase(s)")
    markers.append(f"{f['mean_sentence_words']:.0f} words/sentence, {f['latinate_rate']:.0%} Latinate")
    return f, markers


def predict(text: str, rubric: FormalityRubric | None = None) -> tuple[int, float, dict[str, float], list[str]]:
    r = rubric or load_formality_rubric()
    f, markers = features(text)
    raw = r.intercept + sum(r.weights.get(k, 0.0) * v for k, v in f.items())
    level = 1 + sum(1 for th in r.thresholds if raw >= th)
    return level, raw, f, markers


class FormalityGrader(Grader):
    name = "formality"
    version = "1"
    description = "formality level 1-5 predicted by the marker scorer (rubrics/formality.yaml) vs the requested one"
    view_columns = (("formality_predicted", "value"),)
    summary_columns = (SummaryColumn("formality_mae", "formality MAE", 2, "mean |predicted - requested| level"),
                       SummaryColumn("formality_within1_pct", "formality ±1 %", 0, "share within one level"))

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        errs = [abs(g["detail"]["error"]) for g in grades if "error" in g["detail"]]
        return {"formality_mae": mean(errs),
                "formality_within1_pct": 100.0 * sum(e <= 1 for e in errs) / len(errs) if errs else None,
                "formality_n": len(errs)}

    def __init__(self, rubric: FormalityRubric | None = None) -> None:
        self.rubric = rubric or load_formality_rubric()

    def grade(self, item: GradedRequest) -> Score:
        level, raw, f, markers = predict(prose(item.text), self.rubric)
        want = item.case.formality
        err = level - want
        return Score(
            value=float(level),
            passed=abs(err) <= 1,
            explanation=f"predicted {level} vs requested {want} ({err:+d}); " + "; ".join(markers[:4]),
            detail={"predicted": level, "requested": want, "error": err, "raw_score": round(raw, 4),
                    "features": {k: round(v, 4) for k, v in f.items()}, "markers": markers},
        )


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho with average ranks for ties."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else None


def calibrate(path: Path | None = None, rubric: FormalityRubric | None = None,
              subset: str = "all") -> dict[str, Any]:
    """Scorer accuracy on a labelled JSONL of {"text", "level"}: n, exact, within ±1, Spearman rho."""
    from ..errors import UsageError

    p = path or rubrics_dir() / "formality_calibration.jsonl"
    rows = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{p}: calibration file not found") from None
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text, level = row["text"], row["level"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{p}:{i}: expected a JSON object with 'text' and 'level'") from None
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 5:
            raise UsageError(f"{p}:{i}: field 'level': must be an integer 1-5")
        if subset == "all" or (subset == "even") == (i % 2 == 0):
            rows.append((text, level))
    if not rows:
        raise UsageError(f"{p}: no labelled rows")
    r = rubric or load_formality_rubric()
    preds = [predict(t, r)[0] for t, _ in rows]
    gold = [lvl for _, lvl in rows]
    confusion = [[0] * 5 for _ in range(5)]
    for g, pr in zip(gold, preds, strict=True):
        confusion[g - 1][pr - 1] += 1
    n = len(rows)
    return {
        "file": str(p), "subset": subset, "n": n,
        "exact_accuracy": sum(g == pr for g, pr in zip(gold, preds, strict=True)) / n,
        "within_1_accuracy": sum(abs(g - pr) <= 1 for g, pr in zip(gold, preds, strict=True)) / n,
        "mae": sum(abs(g - pr) for g, pr in zip(gold, preds, strict=True)) / n,
        "spearman_rho": spearman([float(x) for x in gold], [float(x) for x in preds]),
        "confusion": confusion,
    }
